//! Security: unguessable tokens, no release or extension by anyone but the owner, the minimal
//! ACL a lock user needs, and no password in logs, errors or `Debug` output.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, Registry};
use lock_tests::records::Record;
use lock_tests::{subscribers, RedisServer};
use redis::AsyncCommands;

use super::monitor::{Entry, Event, Monitor};
use super::support::{raw, registry};

/// The random part of a token (`host:pid:<32 hex digits>`), as 128 bits.
fn random_bits(token: &str) -> u128 {
    let hex = token.rsplit(':').next().expect("token");
    assert_eq!(hex.len(), 32, "128 bits in hex: {token}");
    u128::from_str_radix(hex, 16).expect("hex")
}

#[tokio::test(start_paused = true)]
async fn tokens_carry_128_unbiased_random_bits_that_owe_nothing_to_time_or_process() {
    // Tokio's clock is frozen: every token below is minted at the same instant.
    let reg = Registry::in_memory();
    const N: usize = 20_000;
    let mut bits = Vec::with_capacity(N);
    let mut prefixes = HashSet::new();
    for i in 0..N {
        let guard = reg.lock(format!("t{i}")).acquire().await.unwrap();
        bits.push(random_bits(guard.token()));
        prefixes.insert(guard.token().rsplit_once(':').unwrap().0.to_owned());
        guard.release().await.unwrap();
    }
    assert_eq!(bits.iter().collect::<HashSet<_>>().len(), N, "all unique");
    assert_eq!(prefixes.len(), 1, "the readable prefix is host:pid only");
    let prefix = prefixes.into_iter().next().unwrap();
    assert!(
        prefix.ends_with(&format!(":{}", std::process::id())),
        "{prefix}"
    );
    // Every bit is a fair coin: within 5 standard deviations of N/2 (sd = sqrt(N)/2).
    let sd = (N as f64).sqrt() / 2.0;
    for bit in 0..128 {
        let ones = bits.iter().filter(|b| (*b >> bit) & 1 == 1).count() as f64;
        assert!(
            (ones - N as f64 / 2.0).abs() < 5.0 * sd,
            "bit {bit} is set in {ones} of {N} tokens"
        );
    }
    // Consecutive tokens share no structure (a counter or a clock would): on average they
    // differ in 64 of 128 bits.
    let mean = bits
        .windows(2)
        .map(|w| f64::from((w[0] ^ w[1]).count_ones()))
        .sum::<f64>()
        / (N - 1) as f64;
    assert!((mean - 64.0).abs() < 1.0, "mean Hamming distance {mean}");

    // Two processes started together draw independent tokens.
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_fault-worker"))
            .args(["tokens", "--count", "2000"])
            .output()
            .expect("run fault-worker tokens")
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(run);
        let b = s.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    let tokens = |out: std::process::Output| -> Vec<String> {
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|line| match Record::parse(line) {
                Ok(Record::Token { token }) => token,
                other => panic!("not a token record: {line:?} ({other:?})"),
            })
            .collect()
    };
    let (a, b) = (tokens(a), tokens(b));
    assert_eq!((a.len(), b.len()), (2000, 2000));
    let a_bits: HashSet<u128> = a.iter().map(|t| random_bits(t)).collect();
    assert!(b.iter().all(|t| !a_bits.contains(&random_bits(t))));
    assert!(!bits.iter().any(|t| a_bits.contains(t)));
    let same_position = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from((random_bits(x) ^ random_bits(y)).count_ones()))
        .sum::<f64>()
        / 2000.0;
    assert!((same_position - 64.0).abs() < 2.0, "{same_position}");
}

/// The library's own release and renewal calls for `key`, captured from MONITOR: (release,
/// renew). The renewal is the script, or `SET .. IFEQ` where the server has it (Valkey).
fn captured_scripts(events: &[Event], redis_key: &str) -> (Entry, Entry) {
    let mut release = None;
    let mut renew = None;
    for (i, e) in events.iter().enumerate() {
        let Event::Command(call) = e else { continue };
        if !call.lua
            && call.name() == "SET"
            && call.arg(1) == redis_key.as_bytes()
            && call.arg_str(3).eq_ignore_ascii_case("IFEQ")
        {
            renew = Some(call.clone());
            continue;
        }
        // On Valkey 9, the release of a lock nobody waited for.
        if !call.lua && call.name() == "DELIFEQ" && call.arg(1) == redis_key.as_bytes() {
            release = Some(call.clone());
            continue;
        }
        if call.lua || call.name() != "EVALSHA" || call.arg(3) != redis_key.as_bytes() {
            continue;
        }
        let body: Vec<&Entry> = events[i + 1..]
            .iter()
            .map_while(|e| match e {
                Event::Command(c) if c.lua => Some(c),
                _ => None,
            })
            .collect();
        let names: Vec<String> = body.iter().map(|c| c.name()).collect();
        // The release of a lock nobody waited for (its bare token): the owner check, the
        // delete.
        if names == ["GET", "DEL"] {
            release = Some(call.clone());
        } else if names.starts_with(&["GET".to_owned(), "PEXPIRE".to_owned()])
            && call.arg_str(2) == "1"
        {
            // Then, at a hold's first renewal, its note of how long the lock has been held.
            renew = Some(call.clone());
        }
    }
    (
        release.expect("a release was captured"),
        renew.expect("a renewal was captured"),
    )
}

/// Replays a captured call with `token` in place of the owner's.
async fn replay(
    con: &mut redis::aio::MultiplexedConnection,
    call: &Entry,
    owner: &str,
    token: &str,
) -> redis::Value {
    let mut cmd = redis::cmd(&call.name());
    for arg in &call.args[1..] {
        if arg == owner.as_bytes() {
            cmd.arg(token);
        } else {
            cmd.arg(arg.as_slice());
        }
    }
    cmd.query_async(con).await.expect("replayed call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_client_can_release_or_extend_a_lock_with_a_stale_or_forged_token() {
    let server = RedisServer::start();
    let monitor = Monitor::start(server.port());
    let reg = registry(&server.url());
    let ttl = Duration::from_millis(600);
    // Capture the library's own release and renewal calls.
    let old = reg.lock("k").ttl(ttl).acquire().await.unwrap();
    let old_token = old.token().to_owned();
    tokio::time::sleep(ttl / 2).await; // past one renewal
    old.release().await.unwrap();
    monitor.sync();
    let (release, renew) = captured_scripts(&monitor.events(), "lock:k");
    // Another owner holds the lock now.
    let held = registry(&server.url())
        .lock("k")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let owner = held.token().to_owned();
    let mut flipped = owner.clone();
    let last = flipped.pop().unwrap();
    flipped.push(if last == '0' { '1' } else { '0' });
    let prefix_only = owner.rsplit_once(':').unwrap().0.to_owned() + ":";
    let mut con = raw(&server.url()).await;
    for forged in [
        old_token.as_str(),
        flipped.as_str(),
        prefix_only.as_str(),
        "",
        &format!("{owner}x"),
        &owner.to_uppercase(),
    ] {
        let before: i64 = con.pttl("lock:k").await.unwrap();
        let released = replay(&mut con, &release, &old_token, forged).await;
        assert_eq!(released, redis::Value::Int(0), "release with {forged:?}");
        let renewed = replay(&mut con, &renew, &old_token, forged).await;
        // Someone else's lock, left untouched: the script's -1, or `SET .. IFEQ .. GET`
        // answering with the value it found (and did not replace).
        let someone_else = if renew.name() == "SET" {
            redis::Value::BulkString(owner.clone().into_bytes())
        } else {
            redis::Value::Array(vec![redis::Value::Int(-1)])
        };
        assert_eq!(renewed, someone_else, "renew with {forged:?}");
        let (value, after): (String, i64) = redis::pipe()
            .get("lock:k")
            .pttl("lock:k")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(value, owner, "still the owner's lock");
        assert!(after <= before, "not extended: {before} -> {after} ms");
    }
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

/// Waits up to 2 s for `check` (a denied command never makes it true: the caller then sees
/// the denial in the ACL log).
/// Whether `check` held within `limit`, polling.
async fn within(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let until = tokio::time::Instant::now() + limit;
    while !check().await {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// Every operation the library performs, as the user `url` names; returns what failed.
/// `observe` is an unrestricted URL of the same server.
async fn exercise(url: &str, observe: &str) -> Vec<String> {
    let build = || registry(url);
    let (a, b) = (build(), build());
    let mut failed = Vec::new();
    // Every run starts from an empty database: a lock an earlier run left held (its release
    // refused) would fail this one for a command it does not need. So the run also creates a
    // fresh fencing counter (which reads the clock).
    let _: () = redis::cmd("FLUSHDB")
        .query_async(&mut raw(observe).await)
        .await
        .unwrap();
    let ttl = Duration::from_millis(150);
    // Plain acquisition, renewal, release.
    match a.lock("plain").ttl(ttl).acquire().await {
        Ok(g) => {
            tokio::time::sleep(ttl * 2).await;
            if g.is_lost() {
                failed.push("renew".to_owned());
            }
            if let Err(e) = g.release().await {
                failed.push(format!("release: {e}"));
            }
        }
        Err(e) => failed.push(format!("acquire: {e}")),
    }
    // Fenced acquisition; a contended one (the script path), waiting by notification.
    match a
        .lock("fenced")
        .fencing(true)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
    {
        Ok(g) => {
            match b.lock("fenced").acquire().await {
                Err(e) if e.is_busy() => {}
                other => failed.push(format!("contended acquire: {other:?}")),
            }
            let waiter = tokio::spawn({
                let b = b.clone();
                async move {
                    b.lock("fenced")
                        .wait(Duration::from_secs(5))
                        .acquire()
                        .await
                }
            });
            // Queued and subscribed, or given up (a command it needs is missing). Generous:
            // under load a new registry's subscriber may take seconds to connect, and releasing
            // before the waiter queued would leave the queue's commands unexercised (`hget`
            // once looked unneeded that way; `hdel`, which takes a handed-over waiter out of
            // the queue, did beside two CPU hogs while the check was the subscription alone).
            let ready = within(Duration::from_secs(30), async || {
                if waiter.is_finished() {
                    return true;
                }
                let queued: i64 = redis::cmd("EXISTS")
                    .arg("queue:{lock:fenced}")
                    .query_async(&mut raw(observe).await)
                    .await
                    .unwrap_or(0);
                queued == 1 && subscribers(observe, "lock:fenced").await > 0
            })
            .await;
            assert!(
                ready,
                "the waiter neither subscribed nor gave up within 30 s"
            );
            if let Err(e) = g.release().await {
                failed.push(format!("release fenced: {e}"));
            }
            match waiter.await.unwrap() {
                Ok(g) => drop(g),
                Err(e) => failed.push(format!("wait: {e}")),
            }
            // Without `unsubscribe` the subscription stays (the denial is logged): no wait then.
            within(Duration::from_secs(2), async || {
                subscribers(observe, "lock:fenced").await == 0
            })
            .await;
        }
        Err(e) => failed.push(format!("fenced acquire: {e}")),
    }
    // A semaphore: two permits taken, a third refused, both renewed, counted, released.
    let permit = |reg: &Registry| reg.lock("pool").permits(2).ttl(ttl).acquire();
    match (permit(&a).await, permit(&b).await) {
        (Ok(g), Ok(h)) => {
            match permit(&a).await {
                Err(e) if e.is_busy() => {}
                other => failed.push(format!("third permit: {other:?}")),
            }
            tokio::time::sleep(ttl * 2).await;
            if g.is_lost() || h.is_lost() {
                failed.push("renew permits".to_owned());
            }
            match a.inspect("pool").await {
                Ok(info) if info.permits.is_some_and(|p| p.held == 2) => {}
                other => failed.push(format!("inspect permits: {other:?}")),
            }
            for guard in [g, h] {
                if let Err(e) = guard.release().await {
                    failed.push(format!("release permit: {e}"));
                }
            }
        }
        (g, h) => failed.push(format!("permits: {:?}", g.and(h))),
    }
    // min_hold keeps the key through an owner-checked expiry change.
    if let Err(e) = a
        .lock("daily")
        .min_hold(Duration::from_secs(60))
        .run(async { Ok::<_, LockError>(()) })
        .await
    {
        failed.push(format!("min_hold: {e}"));
    }
    if let Err(e) = a.inspect("daily").await {
        failed.push(format!("inspect: {e}"));
    }
    if let Err(e) = a.force_unlock("daily").await {
        failed.push(format!("force_unlock: {e}"));
    }
    failed
}

/// The commands (and subcommands) a lock user needs, found by `the_minimal_acl_..`: the
/// library sends `SET`, `EVALSHA` and `SCRIPT LOAD` itself, waiters `SUBSCRIBE` and
/// `UNSUBSCRIBE`, and the scripts call the rest (`TIME` when a fencing counter is created, the
/// sorted-set counts and ranges for semaphores).
const MINIMAL_COMMANDS: &[&str] = &[
    "set",
    "evalsha",
    "script|load",
    "subscribe",
    "unsubscribe",
    "get",
    "del",
    "pexpire",
    "pttl",
    "type",
    "time",
    "publish",
    "exists",
    "zadd",
    "zrange",
    "zrem",
    "zscore",
    "zrangebyscore",
    "zremrangebyscore",
    "zcard",
    "zcount",
    "hset",
    "hget",
    "hdel",
];

/// [`MINIMAL_COMMANDS`], and `delifeq` where the server has it (Valkey 9): the release of a
/// lock nobody waited for.
fn minimal_commands(admin: &mut redis::Connection) -> Vec<&'static str> {
    let delifeq = lock_tests::has_command(admin, "DELIFEQ");
    MINIMAL_COMMANDS
        .iter()
        .copied()
        .chain(delifeq.then_some("delifeq"))
        .collect()
}

fn acl_setuser(con: &mut redis::Connection, commands: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("locker")
        .arg("reset")
        .arg("on")
        .arg(">s3cret-pw");
    cmd.arg("~lock:*")
        .arg("~fence:lock:*")
        .arg("~fence:{lock:*")
        .arg("~queue:lock:*")
        .arg("~queue:{lock:*")
        .arg("~queued:lock:*")
        .arg("~queued:{lock:*")
        .arg("~since:lock:*")
        .arg("~since:{lock:*")
        .arg("&lock:*")
        .arg("-@all");
    for c in commands {
        cmd.arg(format!("+{c}"));
    }
    let _: () = cmd.query(con).expect("ACL SETUSER");
}

/// Denials recorded since the last reset, as `command (reason)`, except `CLIENT SETINFO`: the
/// client sends it on connecting and ignores a refusal, and servers that have it (Redis 7.2+,
/// Valkey) log the refusal (see GUARANTEES.md, Security). Counting it would make every command of
/// the minimal ACL look needed there.
fn acl_denials(con: &mut redis::Connection) -> Vec<String> {
    let log: Vec<Vec<redis::Value>> = redis::cmd("ACL").arg("LOG").query(con).expect("ACL LOG");
    let mut out = Vec::new();
    for entry in log {
        let fields: Vec<String> = entry
            .iter()
            .map(|v| redis::from_redis_value_ref::<String>(v).unwrap_or_default())
            .collect();
        let get = |k: &str| {
            fields
                .iter()
                .position(|f| f == k)
                .and_then(|i| fields.get(i + 1))
                .cloned()
                .unwrap_or_default()
        };
        if get("object") == "client|setinfo" {
            continue;
        }
        out.push(format!(
            "{} ({} {})",
            get("object"),
            get("reason"),
            get("context")
        ));
    }
    let _: () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query(con)
        .expect("ACL LOG RESET");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_acl_for_a_lock_user_is_these_commands_on_the_lock_keys_and_channels() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}/", server.port());

    let minimal = minimal_commands(&mut admin);
    acl_setuser(&mut admin, &minimal);
    let failed = exercise(&url, &server.url()).await;
    assert!(failed.is_empty(), "with the minimal ACL: {failed:?}");
    assert_eq!(acl_denials(&mut admin), Vec::<String>::new());

    // Each command is needed: without it something fails or Redis logs a denial.
    for missing in &minimal {
        let fewer: Vec<&str> = minimal.iter().copied().filter(|c| c != missing).collect();
        acl_setuser(&mut admin, &fewer);
        let failed = exercise(&url, &server.url()).await;
        let denials = acl_denials(&mut admin);
        assert!(
            !failed.is_empty() || !denials.is_empty(),
            "`{missing}` is not needed: everything worked without it"
        );
    }

    // And keys or channels outside the prefix are out of reach.
    acl_setuser(&mut admin, &minimal);
    let mut con = raw(&url).await;
    let denied: redis::RedisResult<()> = con.set("app:data", 1).await;
    let denied = denied.unwrap_err().to_string();
    // Redis: "no permissions to access a key"; Valkey: "No permissions to access a key".
    assert!(
        denied.to_lowercase().contains("no permissions to access"),
        "{denied}"
    );
}

/// `FencedKey`'s ACL, as its rustdoc gives it: the script by hash (`evalsha`, `script|load`
/// after a `SCRIPT FLUSH`), `get` and `set` on its record under `~fenced:*`, and the fenced
/// command on the key; without any one of them, or either key pattern, a write fails or the
/// server logs a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_key_needs_its_script_get_set_and_its_command_on_the_key_and_its_record() {
    use lock_runtime::{FencedKey, FencedWrite};

    let server = RedisServer::start();
    let mut admin = server.connection();
    let url = format!("redis://fencer:s3cret-pw@127.0.0.1:{}/", server.port());
    let set_user = |admin: &mut redis::Connection, commands: &[&str], patterns: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg(&["SETUSER", "fencer", "reset", "on", ">s3cret-pw"])
            .arg(patterns)
            .arg("-@all");
        for c in commands {
            cmd.arg(format!("+{c}"));
        }
        let _: () = cmd.query(admin).expect("ACL SETUSER");
    };
    // A fresh server state every run: no data, no record, no script loaded.
    let exercise = async |admin: &mut redis::Connection| -> Vec<String> {
        let _: () = redis::cmd("FLUSHDB").query(admin).unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(admin).unwrap();
        let mut con = raw(&url).await;
        let balance = FencedKey::new("balance:7");
        let mut failed = Vec::new();
        match balance.write::<i64>(&mut con, 5, "INCRBY", 10).await {
            Ok(FencedWrite::Written(10)) => {}
            other => failed.push(format!("write: {other:?}")),
        }
        match balance.write::<i64>(&mut con, 3, "INCRBY", 1).await {
            Ok(FencedWrite::Refused { highest: 5 }) => {}
            other => failed.push(format!("stale write: {other:?}")),
        }
        match balance.highest(&mut con).await {
            Ok(Some(5)) => {}
            other => failed.push(format!("highest: {other:?}")),
        }
        failed
    };
    let commands = ["evalsha", "script|load", "get", "set", "incrby"];
    let patterns = ["~balance:*", "~fenced:*"];
    set_user(&mut admin, &commands, &patterns);
    assert_eq!(exercise(&mut admin).await, Vec::<String>::new());
    assert_eq!(acl_denials(&mut admin), Vec::<String>::new());
    for missing in commands {
        let fewer: Vec<&str> = commands.into_iter().filter(|c| *c != missing).collect();
        set_user(&mut admin, &fewer, &patterns);
        let failed = exercise(&mut admin).await;
        let denials = acl_denials(&mut admin);
        assert!(
            !failed.is_empty() || !denials.is_empty(),
            "`{missing}` is not needed: everything worked without it"
        );
    }
    for missing in patterns {
        set_user(
            &mut admin,
            &commands,
            &[patterns.into_iter().find(|p| *p != missing).unwrap()],
        );
        assert!(
            !exercise(&mut admin).await.is_empty(),
            "`{missing}` is not needed"
        );
        acl_denials(&mut admin);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirming_with_replicas_needs_wait_on_top_of_the_minimal_acl() {
    let master = RedisServer::start();
    let _replica = RedisServer::start_replica_of(&master);
    let mut admin = master.connection();
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}/", master.port());
    let confirming = || {
        lock_tests::with_timeouts(
            Registry::builder().url(&url).confirm_replicas(1),
            Duration::from_millis(500),
        )
    };
    let with_wait: Vec<&str> = MINIMAL_COMMANDS.iter().copied().chain(["wait"]).collect();
    acl_setuser(&mut admin, &with_wait);
    let guard = confirming()
        .lock("confirmed")
        .acquire()
        .await
        .expect("the minimal ACL plus `+wait` confirms");
    guard.release().await.unwrap();
    assert_eq!(acl_denials(&mut admin), Vec::<String>::new());

    acl_setuser(&mut admin, MINIMAL_COMMANDS);
    let err = confirming()
        .lock("confirmed")
        .acquire()
        .await
        .expect_err("without `+wait` nothing can be confirmed");
    assert!(err.to_string().contains("'wait'"), "{err}");
    assert!(
        acl_denials(&mut admin)
            .iter()
            .any(|d| d.starts_with("wait ")),
        "Redis logged the denied WAIT"
    );
}

/// Every tracing event, formatted with all its fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut f = Fields(String::new());
        span.record(&mut f);
        self.0.lock().unwrap().push(f.0);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut f = Fields(String::new());
        values.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = Fields(format!("{} ", event.metadata().target()));
        event.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = format!("{err} / {err:?}");
    let mut source = err.source();
    while let Some(s) = source {
        let _ = write!(out, " / {s} / {s:?}");
        source = s.source();
    }
    out
}

#[tokio::test]
async fn passwords_never_reach_logs_errors_or_debug_output() {
    const SECRET: &str = "s3cret-pw-4711";
    let capture = Capture::default();
    // tracing caches per call site whether anyone listens. With a single registered dispatcher
    // it asks only the registering thread's default, so call sites first hit by tests on other
    // threads would stay muted: a second dispatcher makes it ask every registered one, and the
    // rebuild re-asks for the call sites already cached.
    let _second = tracing::Dispatch::new(Capture::default());
    let _default = tracing::subscriber::set_default(capture.clone());
    tracing::callsite::rebuild_interest_cache();
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{SECRET}"))
        .arg("~lock:*")
        .arg("~fence:lock:*")
        .arg("~fence:{lock:*")
        .arg("&lock:*")
        .arg("+@all")
        .query(&mut admin)
        .unwrap();
    let good = format!("redis://locker:{SECRET}@127.0.0.1:{}/", server.port());
    let mut seen = Vec::new();

    // A wrong password, a closed port, an unparsable URL.
    let wrong = format!("redis://locker:{SECRET}-wrong@127.0.0.1:{}/", server.port());
    let err = registry(&wrong).lock("k").acquire().await.unwrap_err();
    seen.push(error_chain(&err));
    let closed = format!(
        "redis://locker:{SECRET}@127.0.0.1:{}/",
        lock_tests::free_port()
    );
    let reg = registry(&closed);
    seen.push(format!("{reg:?}"));
    seen.push(error_chain(&reg.lock("k").acquire().await.unwrap_err()));
    let bad = Registry::from_url(&format!("redis://locker:{SECRET}@[::1")).unwrap_err();
    seen.push(error_chain(&bad));

    // A held lock whose renewals fail and whose lease is lost while the server is stopped:
    // warnings are logged with the error Redis or the client reported.
    let reg = registry(&good);
    seen.push(format!("{reg:?}"));
    let guard = reg
        .lock("k")
        .ttl(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();
    seen.push(format!("{guard:?}"));
    server.pause();
    let lost = guard.lost().await;
    server.resume();
    seen.push(error_chain(&lost));
    let _ = guard
        .release()
        .await
        .map_err(|e| seen.push(error_chain(&e)));
    // A command the user may not run.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("-set")
        .arg("-evalsha")
        .query(&mut admin)
        .unwrap();
    let denied = registry(&good).lock("j").acquire().await.unwrap_err();
    assert!(
        denied.to_string().contains("NOPERM") || denied.to_string().contains("permission"),
        "{denied}"
    );
    seen.push(error_chain(&denied));

    // The keeper's warnings are told from the library's reporting thread.
    lock_tests::eventually(
        Duration::from_secs(10),
        "a renewal warning captured",
        || {
            let told = capture
                .0
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("renewal failed"));
            async move { told }
        },
    )
    .await;
    let logs = capture.0.lock().unwrap().clone();
    for text in logs.iter().chain(&seen) {
        assert!(!text.contains(SECRET), "password leaked: {text}");
    }
}
