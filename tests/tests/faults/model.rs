//! Who held each lock on the server, and until when, rebuilt from `MONITOR` (see `monitor.rs`),
//! plus the invariants that can be read off the server's own history:
//!
//! - (d) no renewal (or any scripted `PEXPIRE`/`DEL`) touched a lock whose owner was not the
//!   caller, and none shortened a live lock;
//! - (f) every `SET` of a lock key carried an expiry, and nothing made one persistent.
//!
//! Replies are not in `MONITOR`, but the scripts reveal them: the acquire script runs `TYPE`
//! right after a refused `SET NX`, and the owner-checked scripts run `PEXPIRE`/`DEL` only after
//! their `GET` matched. A plain `SET NX` (no script) is judged by the key's expiry.

use std::collections::HashMap;

use super::monitor::{Entry, Event};

/// One stretch of time during which the server held a lock key for one token.
#[derive(Clone, Debug)]
pub struct Tenure {
    pub token: String,
    /// When the `SET` ran (µs).
    pub since_us: i64,
    /// Every expiry the key was given while held: (when it was set, absolute expiry in ms).
    pub expiries: Vec<(i64, i64)>,
    /// When the key stopped holding this token and why.
    pub ended_us: Option<i64>,
    pub ended_by: &'static str,
}

impl Tenure {
    /// The absolute expiry in force at `at_us`, as µs: the first moment the key is gone.
    pub fn expires_at(&self, at_us: i64) -> i64 {
        let ms = self
            .expiries
            .iter()
            .take_while(|(set, _)| *set <= at_us)
            .last()
            .or(self.expiries.first())
            .map_or(i64::MIN, |(_, ms)| *ms);
        // Redis treats a key as expired once its clock in ms is past the expiry.
        (ms + 1) * 1000
    }

    /// The first moment the server no longer held this token (µs): its end, or its last
    /// expiry while it was never seen to end.
    pub fn held_until(&self) -> i64 {
        self.ended_us
            .unwrap_or(i64::MAX)
            .min(self.expires_at(i64::MAX))
    }

    /// Whether the server held this token over the whole of `[from, to]`.
    pub fn covers(&self, from_us: i64, to_us: i64) -> bool {
        from_us >= self.since_us
            && self.ended_us.is_none_or(|e| to_us <= e)
            && to_us < self.expires_at(to_us)
    }
}

#[derive(Default, Debug)]
pub struct History {
    pub tenures: Vec<Tenure>,
    /// Invariant violations found in the server's history, as readable sentences.
    pub violations: Vec<String>,
    pub commands: usize,
    pub scripts: usize,
    pub renewals: usize,
    pub server_losses: usize,
    /// `ASKING`: commands redirected to a slot's new master while the slot migrated.
    pub asking: usize,
}

impl History {
    pub fn by_token(&self) -> HashMap<&str, Vec<&Tenure>> {
        let mut map: HashMap<&str, Vec<&Tenure>> = HashMap::new();
        for t in &self.tenures {
            map.entry(t.token.as_str()).or_default().push(t);
        }
        map
    }
}

/// Tolerance for Redis' millisecond clock against our µs stamps.
const SLACK_MS: i64 = 2;

struct Live {
    index: usize,
    expiry_ms: i64,
    /// Set when the server holding the key was lost (killed, failed over): whether the key
    /// survived (persistence, replication) shows in the next command that touches it.
    lost_at: Option<i64>,
}

struct Builder<'a> {
    prefix: &'a [u8],
    /// Whether the servers carry `SET .. IFEQ` out; a server without it refuses it as a syntax
    /// error, which MONITOR still shows.
    ifeq: bool,
    history: History,
    live: HashMap<Vec<u8>, Live>,
}

impl Builder<'_> {
    fn is_lock_key(&self, key: &[u8]) -> bool {
        key.starts_with(self.prefix)
    }

    /// Ends the tenure of `key` if it expired by `at_us`.
    fn expire(&mut self, key: &[u8], at_us: i64) {
        let now_ms = at_us / 1000;
        if let Some(live) = self.live.get(key) {
            if now_ms > live.expiry_ms + SLACK_MS {
                let t = &mut self.history.tenures[live.index];
                t.ended_us = Some((live.expiry_ms + 1) * 1000);
                t.ended_by = "expired";
                self.live.remove(key);
            }
        }
    }

    /// A `SET` of `key` to `token` took effect.
    fn acquired(&mut self, key: &[u8], token: &str, at_us: i64, px_ms: i64, how: &str) {
        if let Some(previous) = self.live.remove(key) {
            let now_ms = at_us / 1000;
            let t = &mut self.history.tenures[previous.index];
            if let Some(lost_at) = previous.lost_at {
                // The key did not survive its server's loss.
                t.ended_us = Some(lost_at.min((previous.expiry_ms + 1) * 1000));
                t.ended_by = "server lost";
            } else if now_ms + SLACK_MS < previous.expiry_ms && t.token != token {
                self.history.violations.push(format!(
                    "(model) {how} of {} by {token} at {at_us} while {} held it until {} ms",
                    String::from_utf8_lossy(key),
                    t.token,
                    previous.expiry_ms
                ));
            }
            if previous.lost_at.is_none() {
                t.ended_us = Some(at_us.min((previous.expiry_ms + 1) * 1000));
                t.ended_by = "expired";
            }
        }
        let expiry_ms = at_us / 1000 + px_ms;
        self.history.tenures.push(Tenure {
            token: token.to_owned(),
            since_us: at_us,
            expiries: vec![(at_us, expiry_ms)],
            ended_us: None,
            ended_by: "held at the end",
        });
        self.live.insert(
            key.to_vec(),
            Live {
                index: self.history.tenures.len() - 1,
                expiry_ms,
                lost_at: None,
            },
        );
    }

    /// The owner extended live lock `key` at `at_us` by `ms`.
    fn renewed(&mut self, key: &[u8], at_us: i64, ms: i64) {
        self.survived(key);
        let live = self.live.get_mut(key).expect("owned, so live");
        let new_expiry = at_us / 1000 + ms;
        if new_expiry + SLACK_MS < live.expiry_ms {
            self.history.violations.push(format!(
                "(d) a renewal shortened live lock {} at {} from {} to {} ms",
                String::from_utf8_lossy(key),
                at_us,
                live.expiry_ms,
                new_expiry
            ));
        }
        live.expiry_ms = new_expiry;
        self.history.tenures[live.index]
            .expiries
            .push((at_us, new_expiry));
    }

    fn owner(&self, key: &[u8]) -> Option<&str> {
        self.live
            .get(key)
            .map(|l| self.history.tenures[l.index].token.as_str())
    }

    fn client_command(&mut self, e: &Entry) {
        let name = e.name();
        let key = e.arg(1).to_vec();
        if !self.is_lock_key(&key) {
            return;
        }
        match name.as_str() {
            "SET" => {
                let opts: Vec<String> = e.args[3..]
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
                    .collect();
                let px = opts
                    .iter()
                    .position(|o| o == "PX")
                    .and_then(|i| opts.get(i + 1))
                    .and_then(|v| v.parse::<i64>().ok());
                let Some(px) = px.filter(|v| *v > 0) else {
                    self.history.violations.push(format!(
                        "(f) SET of lock key {} without a positive PX at {}",
                        String::from_utf8_lossy(&key),
                        e.at_us
                    ));
                    return;
                };
                self.expire(&key, e.at_us);
                if let Some(at) = opts.iter().position(|o| o == "IFEQ") {
                    // A renewal, `SET key token IFEQ token PX ms GET`: it changes the key only
                    // while the key holds that token, on a server that has IFEQ. Elsewhere
                    // (Redis 7) it is the keeper's probe, refused: nothing happened.
                    let expected = e.arg_str(3 + at + 1);
                    if self.ifeq
                        && e.arg_str(2) == expected
                        && self.owner(&key) == Some(expected.as_str())
                    {
                        self.renewed(&key, e.at_us, px);
                        self.history.renewals += 1;
                    }
                    return;
                }
                let nx = opts.iter().any(|o| o == "NX");
                if !nx || !self.live.contains_key(&key) {
                    self.acquired(&key, &e.arg_str(2), e.at_us, px, "plain SET");
                }
            }
            "DEL" | "UNLINK" => self.end(&key, e.at_us, "deleted by a client"),
            "PERSIST" => self.history.violations.push(format!(
                "(f) PERSIST of lock key {} at {}",
                String::from_utf8_lossy(&key),
                e.at_us
            )),
            _ => {}
        }
    }

    /// The key was found where it was: its tenure goes on across its server's loss.
    fn survived(&mut self, key: &[u8]) {
        if let Some(live) = self.live.get_mut(key) {
            live.lost_at = None;
        }
    }

    fn end(&mut self, key: &[u8], at_us: i64, why: &'static str) {
        self.expire(key, at_us);
        if let Some(live) = self.live.remove(key) {
            let t = &mut self.history.tenures[live.index];
            t.ended_us = Some(at_us);
            t.ended_by = why;
        }
    }

    fn script(&mut self, call: &Entry, body: &[Entry]) {
        self.history.scripts += 1;
        let numkeys: usize = call.arg_str(2).parse().unwrap_or(0);
        let argv: Vec<&[u8]> = call
            .args
            .iter()
            .skip(3 + numkeys)
            .map(Vec::as_slice)
            .collect();
        let mut renewed_here = false;
        for (i, cmd) in body.iter().enumerate() {
            let key = cmd.arg(1).to_vec();
            if !self.is_lock_key(&key) {
                continue;
            }
            let name = cmd.name();
            match name.as_str() {
                "SET" => {
                    // The acquire script reads the owner (GET) only after its SET NX was refused.
                    let nx = cmd.args[3..].iter().any(|a| a.eq_ignore_ascii_case(b"NX"));
                    let refused = nx
                        && body
                            .get(i + 1)
                            .is_some_and(|n| n.name() == "GET" && n.arg(1) == key.as_slice());
                    let px = (3..cmd.args.len())
                        .find(|&j| cmd.arg_str(j).eq_ignore_ascii_case("PX"))
                        .and_then(|j| cmd.arg_str(j + 1).parse::<i64>().ok())
                        .filter(|v| *v > 0);
                    let Some(px) = px else {
                        self.history.violations.push(format!(
                            "(f) scripted SET of {} without a positive PX at {}",
                            String::from_utf8_lossy(&key),
                            cmd.at_us
                        ));
                        continue;
                    };
                    self.expire(&key, cmd.at_us);
                    let token = cmd.arg_str(2);
                    if refused {
                        self.survived(&key);
                    } else if !nx
                        && self
                            .owner(&key)
                            .is_some_and(|o| argv.contains(&o.as_bytes()))
                    {
                        // The owner's release, handing the lock to the oldest waiter.
                        self.end(&key, cmd.at_us, "handed over");
                        self.acquired(&key, &token, cmd.at_us, px, "handoff");
                    } else {
                        self.acquired(&key, &token, cmd.at_us, px, "acquire script");
                    }
                }
                "PEXPIRE" => {
                    self.expire(&key, cmd.at_us);
                    let ms = cmd.arg_str(2).parse::<i64>().unwrap_or(0);
                    let owner = self.owner(&key).map(str::to_owned);
                    let caller_owns = owner
                        .as_deref()
                        .is_some_and(|o| argv.contains(&o.as_bytes()));
                    if !caller_owns {
                        self.history.violations.push(format!(
                            "(d) PEXPIRE of {} at {} by a script whose arguments do not hold the \
                             owner's token (owner: {owner:?})",
                            String::from_utf8_lossy(&key),
                            cmd.at_us
                        ));
                        continue;
                    }
                    if ms <= 0 {
                        self.history.violations.push(format!(
                            "(d) PEXPIRE {ms} of live lock {} at {}",
                            String::from_utf8_lossy(&key),
                            cmd.at_us
                        ));
                    }
                    self.renewed(&key, cmd.at_us, ms);
                    renewed_here = true;
                }
                "DEL" | "UNLINK" => {
                    self.expire(&key, cmd.at_us);
                    // The owner-checked release runs GET first; force-unlock runs TYPE.
                    let checked = body[..i]
                        .iter()
                        .any(|p| p.name() == "GET" && p.arg(1) == key.as_slice());
                    let owner = self.owner(&key).map(str::to_owned);
                    let caller_owns = owner
                        .as_deref()
                        .is_some_and(|o| argv.contains(&o.as_bytes()));
                    if checked && !caller_owns {
                        self.history.violations.push(format!(
                            "(d) owner-checked DEL of {} at {} by a script that does not hold the \
                             owner's token (owner: {owner:?})",
                            String::from_utf8_lossy(&key),
                            cmd.at_us
                        ));
                    }
                    let why = if checked {
                        "released"
                    } else {
                        "force-unlocked"
                    };
                    self.end(&key, cmd.at_us, why);
                }
                "PERSIST" | "EXPIRE" | "EXPIREAT" | "PEXPIREAT" | "GETSET" => {
                    self.history.violations.push(format!(
                        "(f) script ran {name} on lock key {} at {}",
                        String::from_utf8_lossy(&key),
                        cmd.at_us
                    ));
                }
                _ => {}
            }
        }
        // An owner's renewal or release that read the key and left it alone after its server
        // was lost: the key did not survive.
        let reads: Vec<Vec<u8>> = body
            .iter()
            .filter(|c| c.name() == "GET" && self.is_lock_key(c.arg(1)))
            .map(|c| c.arg(1).to_vec())
            .collect();
        for key in reads {
            let touched = body.iter().any(|c| {
                matches!(c.name().as_str(), "PEXPIRE" | "DEL" | "UNLINK")
                    && c.arg(1) == key.as_slice()
            });
            let by_owner = self
                .owner(&key)
                .is_some_and(|o| argv.contains(&o.as_bytes()));
            if !touched && by_owner {
                if let Some(live) = self.live.get(&key).filter(|l| l.lost_at.is_some()) {
                    let lost_at = live.lost_at.expect("filtered");
                    self.end(&key, lost_at, "server lost");
                }
            }
        }
        // A renewal script is the one that only reads and extends.
        if renewed_here && !body.iter().any(|c| c.name() == "SET" || c.name() == "INCR") {
            self.history.renewals += 1;
        }
    }
}

/// One executed command with what it ran, or the loss of a server.
enum Unit<'e> {
    Lost {
        at_us: i64,
    },
    /// A client command, and the commands its script ran (empty for a plain command).
    Command(&'e Entry, Vec<Entry>),
}

impl Unit<'_> {
    fn at_us(&self) -> i64 {
        match self {
            Self::Lost { at_us } => *at_us,
            Self::Command(e, _) => e.at_us,
        }
    }
}

/// One server's events as units: each script call with the commands it ran.
fn units(events: &[Event]) -> Vec<Unit<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < events.len() {
        match &events[i] {
            Event::Lost { at_us } => out.push(Unit::Lost { at_us: *at_us }),
            // A script's commands without their call: only after a reconnect mid-script.
            Event::Command(e) if e.lua => {}
            Event::Command(e) => {
                let mut body = Vec::new();
                if matches!(e.name().as_str(), "EVALSHA" | "EVAL") {
                    while let Some(Event::Command(c)) = events.get(i + 1) {
                        if !c.lua {
                            break;
                        }
                        body.push(c.clone());
                        i += 1;
                    }
                }
                out.push(Unit::Command(e, body));
            }
        }
        i += 1;
    }
    out
}

/// Rebuilds the tenures of every key starting with `prefix` from the events of the servers
/// that held one copy of the data (a server; a master and the replicas that took over from
/// it), merged in time order. `ifeq`: whether those servers have `SET .. IFEQ`
/// (`lock_tests::fixture_has_set_ifeq` for the fixture's servers).
pub fn rebuild(streams: &[Vec<Event>], prefix: &str, ifeq: bool) -> History {
    let mut b = Builder {
        prefix: prefix.as_bytes(),
        ifeq,
        history: History::default(),
        live: HashMap::new(),
    };
    let mut merged: Vec<Unit<'_>> = streams.iter().flat_map(|s| units(s)).collect();
    // Stable: a server's own units keep their order when stamps tie.
    merged.sort_by_key(Unit::at_us);
    for unit in merged {
        match unit {
            Unit::Lost { at_us } => {
                b.history.server_losses += 1;
                for live in b.live.values_mut() {
                    live.lost_at.get_or_insert(at_us);
                }
            }
            Unit::Command(e, body) => {
                b.history.commands += 1;
                if e.name() == "ASKING" {
                    b.history.asking += 1;
                }
                if matches!(e.name().as_str(), "EVALSHA" | "EVAL") {
                    b.script(e, &body);
                } else {
                    b.client_command(e);
                }
            }
        }
    }
    b.history
}

#[cfg(test)]
mod tests {
    use super::super::monitor::parse_line;
    use super::*;

    fn events(lines: &[&str]) -> Vec<Event> {
        lines
            .iter()
            .map(|l| Event::Command(parse_line(format!("+{l}\r\n").as_bytes()).expect(l)))
            .collect()
    }

    #[test]
    fn a_set_ifeq_renews_only_the_lock_whose_token_it_names() {
        let history = rebuild(
            &[events(&[
                r#"10.000000 [0 127.0.0.1:1] "SET" "lock:k" "A" "NX" "PX" "1000""#,
                // The owner's renewal, then one naming another token: nothing changes.
                r#"10.300000 [0 127.0.0.1:1] "SET" "lock:k" "A" "IFEQ" "A" "PX" "1000" "GET""#,
                r#"10.400000 [0 127.0.0.1:2] "SET" "lock:k" "B" "IFEQ" "B" "PX" "5000" "GET""#,
            ])],
            "lock:",
            true,
        );
        assert!(history.violations.is_empty(), "{:?}", history.violations);
        assert_eq!(history.tenures.len(), 1, "{:?}", history.tenures);
        let a = &history.tenures[0];
        assert_eq!(a.token, "A");
        assert_eq!(a.expires_at(10_350_000), (10_300 + 1000 + 1) * 1000);
        assert_eq!(
            history.renewals, 1,
            "the owner's renewal counts, the other one not"
        );
    }

    /// On Redis 7 a `SET .. IFEQ` is the keeper's probe, refused: the lock expires when it
    /// would have, and another client taking it then is no violation.
    #[test]
    fn a_set_ifeq_on_a_server_without_it_renews_nothing() {
        let history = rebuild(
            &[events(&[
                r#"10.000000 [0 127.0.0.1:1] "SET" "lock:k" "A" "NX" "PX" "1000""#,
                r#"10.300000 [0 127.0.0.1:1] "SET" "lock:k" "A" "IFEQ" "A" "PX" "1000" "GET""#,
                r#"11.100000 [0 127.0.0.1:2] "SET" "lock:k" "B" "NX" "PX" "1000""#,
            ])],
            "lock:",
            false,
        );
        assert!(history.violations.is_empty(), "{:?}", history.violations);
        assert_eq!(history.renewals, 0);
        let a = &history.tenures[0];
        assert_eq!(a.expires_at(10_350_000), (10_000 + 1000 + 1) * 1000);
        assert_eq!(history.tenures[1].token, "B");
    }

    #[test]
    fn the_model_follows_tenures_and_flags_foreign_renewals_and_keys_without_expiry() {
        let history = rebuild(
            &[events(&[
                // A acquires through the script, B is refused (GET follows its SET).
                r#"10.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:k" "fence:{lock:k}" "A" "1000" "1""#,
                r#"10.000010 [0 lua] "SET" "lock:k" "A" "NX" "PX" "1000""#,
                r#"10.000020 [0 lua] "INCR" "fence:{lock:k}""#,
                r#"10.100000 [0 127.0.0.1:2] "evalsha" "s" "2" "lock:k" "fence:{lock:k}" "B" "1000" "1""#,
                r#"10.100010 [0 lua] "SET" "lock:k" "B" "NX" "PX" "1000""#,
                r#"10.100030 [0 lua] "GET" "lock:k""#,
                r#"10.100040 [0 lua] "PTTL" "lock:k""#,
                // A renews; then a script that does not carry A's token extends A's lock.
                r#"10.300000 [0 127.0.0.1:1] "evalsha" "r" "1" "lock:k" "A" "1000""#,
                r#"10.300010 [0 lua] "GET" "lock:k""#,
                r#"10.300020 [0 lua] "PEXPIRE" "lock:k" "1000""#,
                r#"10.400000 [0 127.0.0.1:2] "evalsha" "r" "1" "lock:k" "B" "1000""#,
                r#"10.400010 [0 lua] "GET" "lock:k""#,
                r#"10.400020 [0 lua] "PEXPIRE" "lock:k" "1000""#,
                // A renewal that shortens, by the owner.
                r#"10.500000 [0 127.0.0.1:1] "evalsha" "r" "1" "lock:k" "A" "10""#,
                r#"10.500010 [0 lua] "GET" "lock:k""#,
                r#"10.500020 [0 lua] "PEXPIRE" "lock:k" "10""#,
                // A lock without expiry.
                r#"11.000000 [0 127.0.0.1:3] "SET" "lock:j" "C" "NX""#,
            ])],
            "lock:",
            false,
        );
        assert_eq!(history.tenures.len(), 1, "{:?}", history.tenures);
        let a = &history.tenures[0];
        assert_eq!(a.token, "A");
        assert_eq!(a.since_us, 10_000_010);
        assert!(a.covers(10_000_100, 10_450_000));
        assert!(!a.covers(10_000_100, 10_600_000), "shortened to 10.51 s");
        assert_eq!(a.expires_at(10_350_000), (10_300 + 1000 + 1) * 1000);
        let v = history.violations.join("\n");
        assert_eq!(history.violations.len(), 3, "{v}");
        assert!(v.contains("(d) PEXPIRE of lock:k at 10400020"), "{v}");
        assert!(v.contains("(d) a renewal shortened"), "{v}");
        assert!(
            v.contains("(f) SET of lock key lock:j without a positive PX"),
            "{v}"
        );
    }

    #[test]
    fn a_key_that_survived_its_servers_loss_stays_held_and_one_that_did_not_ends_at_the_loss() {
        let mut first = events(&[
            r#"10.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:k" "fence:{lock:k}" "A" "1000" "0""#,
            r#"10.000010 [0 lua] "SET" "lock:k" "A" "NX" "PX" "1000""#,
            r#"10.000020 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:j" "fence:{lock:j}" "C" "1000" "0""#,
            r#"10.000030 [0 lua] "SET" "lock:j" "C" "NX" "PX" "1000""#,
        ]);
        first.push(Event::Lost { at_us: 10_100_000 });
        // The server that took over: lock:k came back (B is refused, A renews), lock:j did
        // not (D takes it at once).
        let second = events(&[
            r#"10.200000 [0 127.0.0.1:2] "evalsha" "s" "2" "lock:k" "fence:{lock:k}" "B" "1000" "0""#,
            r#"10.200010 [0 lua] "SET" "lock:k" "B" "NX" "PX" "1000""#,
            r#"10.200020 [0 lua] "GET" "lock:k""#,
            r#"10.300000 [0 127.0.0.1:1] "evalsha" "r" "1" "lock:k" "A" "1000""#,
            r#"10.300010 [0 lua] "GET" "lock:k""#,
            r#"10.300020 [0 lua] "PEXPIRE" "lock:k" "1000""#,
            r#"10.400000 [0 127.0.0.1:2] "evalsha" "s" "2" "lock:j" "fence:{lock:j}" "D" "1000" "0""#,
            r#"10.400010 [0 lua] "SET" "lock:j" "D" "NX" "PX" "1000""#,
        ]);
        let history = rebuild(&[first, second], "lock:", false);
        assert!(history.violations.is_empty(), "{:?}", history.violations);
        let by_token = history.by_token();
        assert!(
            by_token["A"][0].covers(10_000_100, 11_200_000),
            "A held across the loss"
        );
        let c = by_token["C"][0];
        assert_eq!((c.ended_us, c.ended_by), (Some(10_100_000), "server lost"));
        assert_eq!(by_token["D"][0].since_us, 10_400_010);
    }

    #[test]
    fn a_release_that_hands_the_lock_over_ends_one_tenure_where_the_next_begins() {
        let release = |at: u32, caller: &str, next: &str| {
            [
                format!(
                    r#"10.{at}000 [0 127.0.0.1:1] "evalsha" "x" "4" "lock:k" "fence:{{lock:k}}" "queue:{{lock:k}}" "queued:{{lock:k}}" "{caller}" "PUBLISH""#
                ),
                format!(r#"10.{at}010 [0 lua] "GET" "lock:k""#),
                format!(r#"10.{at}020 [0 lua] "EXISTS" "queue:{{lock:k}}""#),
                format!(r#"10.{at}030 [0 lua] "SET" "lock:k" "{next}" "PX" "1000""#),
                format!(r#"10.{at}040 [0 lua] "PUBLISH" "lock:k" "x""#),
            ]
        };
        let mut lines =
            vec![r#"10.000000 [0 127.0.0.1:1] "SET" "lock:k" "A" "NX" "PX" "1000""#.to_owned()];
        lines.extend(release(100, "A", "B"));
        // A script without B's token sets B's lock to C: an acquisition while B holds it.
        lines.extend(release(200, "A", "C"));
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let history = rebuild(&[events(&lines)], "lock:", false);
        let by_token = history.by_token();
        let a = by_token["A"][0];
        assert_eq!((a.ended_us, a.ended_by), (Some(10_100_030), "handed over"));
        assert_eq!(by_token["B"][0].since_us, 10_100_030);
        let v = history.violations.join("\n");
        assert_eq!(history.violations.len(), 1, "{v}");
        assert!(v.contains("(model) acquire script of lock:k by C"), "{v}");
    }
}
