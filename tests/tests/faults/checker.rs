//! The invariants of the fault workload, checked after a run against the workers' records and
//! the servers' own histories; one function per invariant, so each is findable by name, and
//! the summary every run prints.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write as _;
use std::time::Duration;

use lock_tests::records::{LockKind, Outcome, Record, StoreCall};

use super::model::{self, History};
use super::workers::Line;

/// The lease of every lock in the workload.
pub const TTL: Duration = Duration::from_millis(1000);
/// (c): a lock whose holder crashed or stopped is taken by another client within `TTL` plus
/// this. It covers what comes after the key's expiry: the in-flight renewal that may still land
/// (one proxy hop), the waiter's wake-up (scheduled at the holder's remaining lease + 1 ms), one
/// round trip, and process scheduling on a loaded 2-core machine.
pub const FREE_BOUND: Duration = Duration::from_millis(300);
/// (g): dropping a guard or a guarded future returns within this, whatever the network does
/// (a blocking drop would take at least the 500 ms command timeout under a black hole).
const DROP_BOUND: Duration = Duration::from_millis(100);
/// (g): the worker's 10 ms heartbeat never runs later than this, except while the worker itself
/// is stopped.
const STALL_BOUND: Duration = Duration::from_millis(500);
/// (e): the library's clock-drift allowance for [`TTL`] (ttl/100 + 2 ms). It stops a body at
/// the latest this long before the key can expire on the server, so a body stopped after the
/// key expired was woken at least this late.
const DRIFT: Duration = Duration::from_millis(12);

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FaultRecord {
    pub kind: String,
    pub start_us: i64,
    pub end_us: i64,
    /// Client faults: the worker hit, and whether it held the lock at that moment.
    pub victim: Option<u32>,
    pub held: bool,
    /// Client faults: the lock's remaining lease right after the hit (ms), and its token.
    pub pttl_ms: i64,
    pub victim_token: Option<String>,
    /// Faults on a holder: the Redis key of the lock it held (the register's when absent).
    #[serde(default)]
    pub key: Option<String>,
}

/// A jump of the machine's wall clock against its monotonic clock during a run (`clock`). Every
/// stamp the checks compare (the workers', `MONITOR`'s, Postgres's) is wall-clock time, and so
/// is every server's expiry: a jump forward runs out every lease at once, on every server of the
/// machine, while the clients time theirs on the monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockStep {
    /// The wall clock's last reading before the jump (µs).
    pub before_us: i64,
    /// Its first reading after the jump (µs).
    pub after_us: i64,
    /// How much further the wall clock moved than the monotonic one between those readings
    /// (µs; negative: it went back).
    pub moved_us: i64,
}

impl ClockStep {
    /// The latest the wall clock can have read when it jumped: the jump came between
    /// `before_us` and this, on the clock as it ran before it.
    pub fn jumped_by(&self) -> i64 {
        self.after_us - self.moved_us
    }

    /// Whether this is a jump forward that ran out a lease expiring at `expiry`: the expiry
    /// came after the latest moment the jump can have come, and at the latest at the first
    /// reading after it.
    pub fn passed(&self, expiry: i64) -> bool {
        self.moved_us > 0 && self.jumped_by() < expiry && expiry <= self.after_us
    }
}

/// One critical section as its worker reported it.
#[derive(Clone, Debug)]
struct Section {
    worker: u32,
    task: String,
    token: String,
    fence: u64,
    /// When its acquisition was called.
    called: i64,
    start: i64,
    end: i64,
    outcome: Ending,
    lost_seen: bool,
    /// When its worker saw the lease lost (absent in records written before it was recorded).
    lost_at: Option<i64>,
    write: StoreCall,
    hold_ms: u64,
    kind: LockKind,
    /// The Redis keys it held.
    keys: Vec<String>,
}

/// How a section ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// As its `end` record says.
    Reported(Outcome),
    /// Its worker was killed before it wrote the `end` record.
    Killed,
}

impl Ending {
    /// Returned `Ok`, by the `end` record.
    fn ok(self) -> bool {
        self == Self::Reported(Outcome::Ok)
    }

    /// Returned `LockError::Lost`, by the `end` record.
    fn lost(self) -> bool {
        matches!(self, Self::Reported(Outcome::Lost(_)))
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reported(outcome) => write!(f, "{outcome}"),
            Self::Killed => f.write_str("killed"),
        }
    }
}

impl Section {
    /// Whether it held its keys alone (a writer), not side by side (a reader, a permit).
    fn exclusive(&self) -> bool {
        matches!(
            self.kind,
            LockKind::Lock | LockKind::Write | LockKind::Multi | LockKind::Leader
        )
    }

    /// A section of the register's fenced lock.
    fn on_register(&self) -> bool {
        self.kind == LockKind::Lock
    }

    /// Whether its body was cancelled when the lease was lost: every task but the register's
    /// `continue` one (`.1`).
    fn cancels(&self) -> bool {
        !self.task.ends_with(".1")
    }
}

fn sections(lines: &[Line], killed: &HashMap<u32, i64>) -> Vec<Section> {
    let mut open: BTreeMap<(&str, u64), Section> = BTreeMap::new();
    let mut over: HashMap<(&str, u64), (i64, bool, Option<i64>)> = HashMap::new();
    let mut done = Vec::new();
    for line in lines {
        match &line.record {
            Record::Over {
                w,
                seq,
                end,
                lost_seen,
                lost_at,
            } => {
                over.insert((w, *seq), (*end, *lost_seen, *lost_at));
            }
            Record::Begin {
                w,
                seq,
                token,
                fence,
                called,
                start,
                kind,
                keys,
                hold_ms,
            } => {
                // Still open at the end only if its worker was killed first (see below).
                let section = Section {
                    worker: line.worker,
                    task: w.clone(),
                    token: token.clone(),
                    fence: *fence,
                    called: *called,
                    start: *start,
                    end: 0,
                    outcome: Ending::Killed,
                    lost_seen: false,
                    lost_at: None,
                    write: StoreCall::NotMade,
                    hold_ms: *hold_ms,
                    kind: *kind,
                    keys: keys.clone(),
                };
                open.insert((w, *seq), section);
            }
            Record::End {
                w,
                seq,
                token,
                fence,
                start,
                end,
                outcome,
                lost_seen,
                lost_at,
                write,
                kind,
                keys,
                ..
            } => {
                let began = open.remove(&(w.as_str(), *seq));
                done.push(Section {
                    worker: line.worker,
                    task: w.clone(),
                    token: token.clone(),
                    fence: *fence,
                    called: began.as_ref().map_or(*start, |b| b.called),
                    start: *start,
                    end: *end,
                    outcome: Ending::Reported(*outcome),
                    lost_seen: *lost_seen,
                    lost_at: *lost_at,
                    write: *write,
                    hold_ms: began.map_or(0, |b| b.hold_ms),
                    kind: *kind,
                    keys: keys.clone(),
                });
            }
            _ => {}
        }
    }
    for (id, mut s) in open {
        // Killed before its `end` record: its effects stop where the body said it was over
        // (the kill came during the release), else at the kill (it came inside the section).
        let at = killed
            .get(&s.worker)
            .unwrap_or_else(|| panic!("section {} of worker {} never ended", s.fence, s.worker));
        (s.end, s.lost_seen, s.lost_at) = over.get(&id).copied().unwrap_or((*at, false, None));
        done.push(s);
    }
    done.sort_by_key(|s| s.start);
    done
}

#[derive(Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub lines: Vec<String>,
}

impl Report {
    fn fail(&mut self, invariant: &str, what: String) {
        self.violations.push(format!("({invariant}) {what}"));
    }
}

/// What a run must have exercised, or it proves nothing: a check that passes over nothing is a
/// failure.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Minimums {
    /// Critical sections of every kind together.
    pub sections: usize,
    /// Critical sections of the register (the plain lock) among them.
    pub register: usize,
    /// `on_lost = cancel` bodies reported lost and checked by (e).
    pub cancelled: usize,
    /// Hand-overs after a holder was killed or stopped, judged by (c).
    pub hand_overs: usize,
    /// Among them, new terms after the election's leader was killed.
    #[serde(default)]
    pub new_terms: usize,
    /// Renewal script calls the servers ran.
    pub renewals: usize,
    /// Client faults that hit the lock's holder while it held the lock.
    pub holder_hits: usize,
    /// Commands that followed an `ASK` redirection during a slot migration.
    pub asking: usize,
    /// Sections of each other lock kind (readers, writers, permits, multi-key).
    pub per_kind: usize,
}

#[cfg(test)]
impl<'a> Inputs<'a> {
    /// A run with nothing in it but `lines` and `histories`, for checks of synthetic histories.
    fn synthetic(lines: &'a [Line], histories: &'a [History]) -> Self {
        static NO_KILLS: std::sync::LazyLock<HashMap<u32, i64>> =
            std::sync::LazyLock::new(HashMap::new);
        Self {
            name: "synthetic",
            fencing: true,
            minimums: Minimums::NONE,
            bad_exits: &[],
            lines,
            killed: &NO_KILLS,
            histories,
            quorum: 1,
            permits: 2,
            faults: &[],
            clock_steps: &[],
            register: 0,
            rejected: 0,
            log: &[],
            leftover_without_ttl: &[],
            proxy: (0, 0),
            ran_for: Duration::from_secs(1),
        }
    }
}

impl Minimums {
    /// For checks of synthetic histories and kept runs made up by tests.
    pub const NONE: Self = Self {
        sections: 0,
        register: 0,
        cancelled: 0,
        hand_overs: 0,
        new_terms: 0,
        renewals: 0,
        holder_hits: 0,
        asking: 0,
        per_kind: 0,
    };
}

pub struct Inputs<'a> {
    pub name: &'a str,
    /// Whether locks carried fencing tokens (Redlock has none: the store then only counts).
    pub fencing: bool,
    pub minimums: Minimums,
    /// Workers that exited other than cleanly, with how.
    pub bad_exits: &'a [String],
    pub lines: &'a [Line],
    pub killed: &'a HashMap<u32, i64>,
    pub histories: &'a [History],
    pub quorum: usize,
    /// The semaphore's permits.
    pub permits: usize,
    pub faults: &'a [FaultRecord],
    /// The jumps of the machine's wall clock the run saw.
    pub clock_steps: &'a [ClockStep],
    pub register: i64,
    pub rejected: i64,
    pub log: &'a [String],
    pub leftover_without_ttl: &'a [String],
    pub proxy: (u64, u64),
    pub ran_for: Duration,
}

/// The invariants, one function each:
/// (a) no two critical sections overlapped, and each lay inside the server-side tenure of its
///     token, a section reported lost judged up to the moment its worker saw the loss;
/// (b) the fenced store accepted no stale write, the register equals the number of accepted
///     increments, and fencing tokens strictly increase in the server's order of holders;
/// (c) after a holder was killed or stopped, another client held the lock within ttl + bound;
/// (d) no renewal extended or deleted a lock it did not own, or shortened a live one;
/// (e) with `on_lost = cancel`, every cancelled body stopped before its key expired on the
///     server (smallest margin reported), except where its process was stopped or kept off
///     the CPU from when the timer was due to the body's end;
/// (f) every lock key always had a TTL;
/// (g) dropping or cancelling never blocked the worker's runtime;
/// and the run itself: every worker exited cleanly, and the run exercised at least its
/// [`Minimums`].
pub fn check(i: &Inputs<'_>) -> Report {
    let f = Facts::new(i);
    let mut r = Report::default();
    trusted_sections_never_overlap(&f, &mut r);
    let completed_margin = trusted_sections_lie_inside_their_tenure(&f, &mut r);
    cancel_mode_bodies_never_return_ok_after_a_loss(&f, &mut r);
    if i.fencing {
        the_store_accepted_no_stale_fence(&f, &mut r);
        no_fencing_token_is_handed_out_twice(&f, &mut r);
        fencing_tokens_increase_in_the_servers_order_of_holders(&f, &mut r);
    }
    let late_writes = no_accepted_increment_was_lost(&f, &mut r);
    the_register_counts_every_accepted_increment(&f, late_writes, &mut r);
    the_store_accepted_what_the_workers_saw(&f, &mut r);
    let hand_overs = the_lock_is_handed_over_soon_after_its_holder_is_hit(&f, &mut r);
    no_client_touched_a_lock_it_did_not_own(&f, &mut r);
    every_lock_key_has_a_ttl(&f, &mut r);
    let cancels = cancelled_bodies_stop_before_their_key_expires(&f, &mut r);
    let drops = drops_never_block_the_runtime(&f, &mut r);
    let worst_stall = the_runtime_never_stalls(&f, &mut r);
    every_worker_exited_cleanly(&f, &mut r);
    the_run_exercised_what_it_claims(&f, &hand_overs, &cancels, &mut r);
    r.lines = summary(
        &f,
        &Figures {
            completed_margin,
            hand_overs,
            cancels,
            drops,
            worst_stall,
            late_writes,
            violations: r.violations.len(),
        },
    );
    r
}

/// What the checks read: the run's inputs, and what is derived from them once.
struct Facts<'a> {
    i: &'a Inputs<'a>,
    /// Every critical section, by start.
    secs: Vec<Section>,
    /// Per node, the server-side tenures of each token.
    tenures: Vec<HashMap<&'a str, Vec<&'a model::Tenure>>>,
    /// The store's accepted writes, in order: (fence, value written).
    log: Vec<(u64, i64)>,
    /// The Redis key of the register's lock.
    register: String,
    /// Each worker's process id.
    workers_by_pid: HashMap<u32, u32>,
}

impl<'a> Facts<'a> {
    fn new(i: &'a Inputs<'a>) -> Self {
        let log = i
            .log
            .iter()
            .map(|entry| {
                let (fence, value) = entry.split_once(':').expect("fence:value");
                (fence.parse().expect("fence"), value.parse().expect("value"))
            })
            .collect();
        let secs = sections(i.lines, i.killed);
        let register = secs
            .iter()
            .find(|s| s.on_register())
            .and_then(|s| s.keys.first().cloned())
            .unwrap_or_else(|| "lock:register".to_owned());
        let workers_by_pid = i
            .lines
            .iter()
            .filter_map(|l| match l.record {
                Record::Ready { pid, .. } => Some((pid, l.worker)),
                _ => None,
            })
            .collect();
        Self {
            i,
            secs,
            tenures: i.histories.iter().map(History::by_token).collect(),
            log,
            register,
            workers_by_pid,
        }
    }

    /// Whether the process that owns `token` (`host:pid:random`) could hold a lock at `at`:
    /// not killed by then, and not stopped at that moment.
    fn alive_at(&self, token: &str, at: i64) -> bool {
        let Some(worker) = self.worker_of(token) else {
            return false;
        };
        self.i.killed.get(&worker).is_none_or(|killed| at < *killed)
            && !self.paused_during(worker, at, at)
    }

    /// The worker whose process made `token`.
    fn worker_of(&self, token: &str) -> Option<u32> {
        token
            .rsplit(':')
            .nth(1)
            .and_then(|pid| pid.parse::<u32>().ok())
            .and_then(|pid| self.workers_by_pid.get(&pid).copied())
    }

    /// How much of `[from, to]` a server's pulses show it kept off the CPU (it, or the test
    /// process with its proxies, ran nothing: see `Pulse`): per server, its late pulses'
    /// overlap with `[from, to]`; the longest of the servers, not their sum, since one starved
    /// machine makes them late together. Not a worker's late heartbeats: the library's own
    /// code holding the worker's runtime makes those late too.
    fn kept_off_the_cpu(&self, from: i64, to: i64) -> i64 {
        let mut by_server: HashMap<(usize, usize), i64> = HashMap::new();
        for (group, h) in self.i.histories.iter().enumerate() {
            for &(server, due, ran) in &h.pulse_stalls {
                *by_server.entry((group, server)).or_default() +=
                    (ran.min(to) - due.max(from)).max(0);
            }
        }
        by_server.into_values().max().unwrap_or(0)
    }

    /// Every section with the end of the stretch it must have held its keys for: all of it,
    /// unless its worker saw the lease lost, then until that moment (a loss seen late is a
    /// double grant as much as one never seen), or until its own process was stopped before
    /// (a stopped process acts on nothing; it sees the loss only once it runs again). A loss
    /// recorded while the worker's runtime was kept off the CPU (its heartbeat says so) counts
    /// from where that stall began. Records from before the loss's moment was recorded leave a
    /// lost section unjudged.
    ///
    /// A lease that a jump of the wall clock ran out (see [`Facts::jumped_over`]) is judged up
    /// to the jump, if the section's stretch ended within a ttl after it: the holder learns of
    /// it at its next renewal, and the next holder may get in first (the limit GUARANTEES.md
    /// states for a server's clock jumping forward).
    fn judged(&self) -> impl Iterator<Item = (&Section, i64)> {
        self.secs.iter().filter_map(|s| {
            let to = self.stretch(s)?;
            let to = self.up_to_a_jump(s, to);
            (to > s.start).then_some((s, to))
        })
    }

    /// Where `s`'s stretch ends, a jump of the wall clock aside (see [`Facts::judged`]).
    fn stretch(&self, s: &Section) -> Option<i64> {
        if !(s.outcome.lost() || s.lost_seen) {
            return Some(s.end);
        }
        let seen = s.lost_at?.min(s.end);
        // Recorded while the worker's runtime was kept off the CPU: the loss may have come
        // any time in that stall, so the record speaks only for the time before it.
        let seen = self.stalled_since(s.worker, seen).unwrap_or(seen);
        let stopped = self
            .i
            .faults
            .iter()
            .filter(|p| p.kind.starts_with("client-sigstop") && p.victim == Some(s.worker))
            .map(|p| p.start_us)
            .filter(|&at| s.start <= at && at < seen)
            .min();
        Some(stopped.unwrap_or(seen))
    }

    /// `to`, or the last reading of the wall clock before a jump forward that ran out one of
    /// `s`'s leases, where `to` came within a ttl after that jump.
    fn up_to_a_jump(&self, s: &Section, to: i64) -> i64 {
        match self.jumped_over(s) {
            Some(jump) if to <= jump.after_us + us(TTL) => to.min(jump.before_us),
            _ => to,
        }
    }

    /// Sections judged only up to a jump of the wall clock.
    fn judged_up_to_a_jump(&self) -> usize {
        self.secs
            .iter()
            .filter(|s| {
                self.stretch(s)
                    .is_some_and(|to| self.up_to_a_jump(s, to) < to)
            })
            .count()
    }

    /// The jump forward of the wall clock that ran out a lease of `s`: a tenure of its token
    /// that began before the jump, and whose expiry the jump passed over (it came after the
    /// latest moment the jump can have come, and at the latest at the first reading after).
    fn jumped_over(&self, s: &Section) -> Option<&'a ClockStep> {
        self.i.clock_steps.iter().find(|jump| {
            s.keys.iter().any(|key| {
                self.tenures_of(&s.token, key).flatten().any(|t| {
                    t.since_us <= jump.jumped_by() && jump.passed(t.expires_at(jump.after_us))
                })
            })
        })
    }

    /// `to - from`, less how far the wall clock jumped in between.
    fn elapsed(&self, from: i64, to: i64) -> i64 {
        let jumped: i64 = self
            .i
            .clock_steps
            .iter()
            .filter(|jump| from <= jump.before_us && jump.after_us <= to)
            .map(|jump| jump.moved_us)
            .sum();
        to - from - jumped
    }

    /// When `worker`'s runtime was last seen running on time before `at` (its previous
    /// heartbeat), where its heartbeat shows it kept off the CPU over `at` (a late heartbeat due
    /// before `at` that ran at it, within one wake-up's slack); `None` where it ran on time then.
    fn stalled_since(&self, worker: u32, at: i64) -> Option<i64> {
        self.i
            .lines
            .iter()
            .filter(|line| line.worker == worker)
            .filter_map(|line| match line.record {
                Record::Stall {
                    at: woke, late_us, ..
                } => {
                    let due = woke - i64::try_from(late_us).expect("fits");
                    // The heartbeat before it ran on time, up to one period before this one
                    // was due: the runtime was last seen running then.
                    (due < at && woke >= at - WAKE_SLACK_US).then_some(due - us(Record::HEARTBEAT))
                }
                _ => None,
            })
            .min()
    }

    /// Lost sections whose loss was recorded while their worker was kept off the CPU (see
    /// [`Facts::judged`]).
    fn losses_seen_in_a_stall(&self) -> usize {
        self.secs
            .iter()
            .filter(|s| s.outcome.lost() || s.lost_seen)
            .filter_map(|s| s.lost_at.map(|at| (s, at.min(s.end))))
            .filter(|(s, at)| self.stalled_since(s.worker, *at).is_some())
            .count()
    }

    /// Whether `worker`'s runtime was kept off the CPU from the moment a timer was due (`due`)
    /// until it woke (`woke`): one late heartbeat's stall, from when it was due until it ran,
    /// covers that span, less the one heartbeat period it may have been due after `due`, and
    /// less the slack of one wake-up at its end (the body's end and the heartbeat are stamped
    /// by different tasks of that wake-up, in either order).
    fn starved(&self, worker: u32, due: i64, woke: i64) -> bool {
        self.i.lines.iter().any(|line| {
            let Record::Stall { at, late_us, .. } = line.record else {
                return false;
            };
            let late = i64::try_from(late_us).expect("fits");
            line.worker == worker
                && at - late <= due + us(Record::HEARTBEAT)
                && at >= woke - WAKE_SLACK_US
        })
    }

    /// Whether `worker` was itself stopped (SIGSTOP) at some moment of `[from, to]`.
    fn paused_during(&self, worker: u32, from: i64, to: i64) -> bool {
        self.i.faults.iter().any(|p| {
            p.kind.starts_with("client-sigstop")
                && p.victim == Some(worker)
                && from <= p.end_us
                && p.start_us <= to
        })
    }

    /// `token`'s tenures of `key` on each node.
    fn tenures_of<'s>(
        &'s self,
        token: &'s str,
        key: &'s str,
    ) -> impl Iterator<Item = Vec<&'a model::Tenure>> + 's {
        self.tenures.iter().map(move |node| {
            node.get(token).map_or_else(Vec::new, |ts| {
                ts.iter().copied().filter(|t| t.key == key).collect()
            })
        })
    }

    /// Whether at every moment of `[s.start, to]` at least a quorum of nodes held `key` for
    /// `s.token`. Not necessarily the same nodes throughout: a straggling node's grant may land
    /// just after the section began, and another node may be lost in the middle of it.
    ///
    /// A node lost with `kill -9` right after it granted (its last output before the kill is
    /// lost) counts from the grant until it is back, for at most a lease: down, it grants
    /// nobody else (Redlock restarts a node empty only after a ttl, as the deployments guide
    /// asks; a Cluster or Sentinel replica promoted without the grant is the limit of
    /// asynchronous replication that GUARANTEES.md states, and the overlap check still holds
    /// there), and its grant is a write its history cannot show. The grant is the moment the
    /// other nodes show for the same attempt (the token is new per attempt), or with none
    /// showing it a moment between the acquisition's call and the section's start; it must be
    /// able to fall in the node's lost output.
    fn held_by_a_quorum_throughout(&self, s: &Section, to: i64, key: &str) -> bool {
        let (token, from) = (s.token.as_str(), s.start);
        let mut held: Vec<Vec<(i64, i64)>> = self
            .tenures_of(token, key)
            .map(|ts| ts.iter().map(|t| (t.since_us, t.held_until())).collect())
            .collect();
        let shown = held.iter().flatten().map(|&(since, _)| since).min();
        for (node, history) in held.iter_mut().zip(self.i.histories) {
            if let Some(grant) = hidden_grant(s, shown, history) {
                node.push(grant);
            }
        }
        let holders_at = |at: i64| {
            held.iter()
                .filter(|node| node.iter().any(|&(since, until)| since <= at && at < until))
                .count()
        };
        // The count only changes where a tenure starts or ends.
        let changes = held
            .iter()
            .flatten()
            .flat_map(|&(since, until)| [since, until])
            .filter(|&at| from < at && at <= to);
        std::iter::once(from)
            .chain(changes)
            .chain(std::iter::once(to))
            .all(|at| holders_at(at) >= self.i.quorum)
    }

    fn accepted(&self) -> i64 {
        i64::try_from(self.log.len()).expect("fits")
    }
}

/// A grant of `s` that `history` cannot show, as (granted, held until): the grant came at
/// `shown` (when another node's history shows the same attempt), or with none showing it between
/// the call and the section's start; it is hidden if that server's history stops before it and
/// its output was lost (or not watched) after it. From the earliest moment it can have come,
/// for at most a ttl: until the server was back without it, or, where it ran on (a gap), until
/// the owner's next write shows it (`model::Builder::revealed`).
fn hidden_grant(s: &Section, shown: Option<i64>, history: &model::History) -> Option<(i64, i64)> {
    let (earliest, latest) = shown.map_or((s.called, s.start), |at| (at, at));
    let o = history
        .outages
        .iter()
        .find(|o| o.seen_until_us <= latest && earliest <= o.lost_us + MONITOR_SLACK_US)?;
    let granted = earliest.max(o.seen_until_us);
    let back = if o.ran_on { i64::MAX } else { o.back_us };
    Some((granted, back.min(granted + us(TTL))))
}

/// How far apart the stamps of one wake-up of a worker's runtime can be (its tasks run one
/// after another).
const WAKE_SLACK_US: i64 = 1_000;

/// How far apart two servers' `MONITOR` stamps of one moment can be (their clocks are one
/// machine's, read at different points of the event loop).
const MONITOR_SLACK_US: i64 = 2_000;

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).expect("fits")
}

/// (a) No two sections held a key together unless both may (each judged over the stretch
/// [`Facts::judged`] gives it): readers beside readers, up to the semaphore's permits side by
/// side, and a writer (the register's lock, a read-write lock's writer, a multi-key lock on
/// each of its keys) alone.
fn trusted_sections_never_overlap(f: &Facts<'_>, r: &mut Report) {
    let mut by_key: BTreeMap<&str, Vec<(&Section, i64)>> = BTreeMap::new();
    for (s, to) in f.judged() {
        for key in &s.keys {
            by_key.entry(key).or_default().push((s, to));
        }
    }
    for (key, secs) in by_key {
        // In order of start (as `secs` is): those still inside when the next one starts.
        let mut inside: Vec<(&Section, i64)> = Vec::new();
        for (s, to) in secs {
            inside.retain(|(_, p_to)| *p_to > s.start);
            let clash = inside.iter().find(|(p, _)| s.exclusive() || p.exclusive());
            if let Some((p, p_to)) = clash {
                r.fail(
                    "a",
                    format!(
                        "sections overlap on {key}: {} ({}) fence {} [{}, {p_to}] ({}) and {} ({}) fence {} [{}, {to}] ({})",
                        p.task, p.kind, p.fence, p.start, p.outcome, s.task, s.kind, s.fence, s.start, s.outcome
                    ),
                );
            } else if s.kind == LockKind::Permit && inside.len() >= f.i.permits {
                let held: Vec<String> = inside
                    .iter()
                    .chain([&(s, to)])
                    .map(|(p, p_to)| format!("{} [{}, {p_to}]", p.task, p.start))
                    .collect();
                r.fail(
                    "a",
                    format!(
                        "{} permits of {key} held at once, of {}: {}",
                        held.len(),
                        f.i.permits,
                        held.join(", ")
                    ),
                );
            }
            inside.push((s, to));
        }
    }
}

/// (a) Each section lay inside a server-side tenure of its token on a quorum of nodes, over the
/// stretch [`Facts::judged`] gives it. Returns the smallest lease left when a section that
/// never saw a loss ended (µs).
fn trusted_sections_lie_inside_their_tenure(f: &Facts<'_>, r: &mut Report) -> i64 {
    let mut completed_margin = i64::MAX;
    for (s, to) in f.judged() {
        for key in &s.keys {
            if !f.held_by_a_quorum_throughout(s, to, key) {
                let per_node: Vec<String> = f
                    .tenures_of(&s.token, key)
                    .enumerate()
                    .map(|(node, t)| format!("node {node}: {t:?}"))
                    .collect();
                let faults: Vec<String> =
                    f.i.faults
                        .iter()
                        .filter(|p| p.start_us <= to && s.start <= p.end_us)
                        .map(|p| format!("{} [{}, {}]", p.kind, p.start_us, p.end_us))
                        .collect();
                r.fail(
                    "a",
                    format!(
                        "{} ({}) fence {} [{}, {to}] ({}, ended {}) ran outside its server-side \
                         tenure of {key} on a quorum; {}; faults meanwhile: {faults:?}",
                        s.task,
                        s.kind,
                        s.fence,
                        s.start,
                        s.outcome,
                        s.end,
                        per_node.join("; ")
                    ),
                );
            }
            if s.outcome.lost() || s.lost_seen {
                continue;
            }
            for t in f.tenures_of(&s.token, key).flatten() {
                if t.covers(s.start, s.end) {
                    completed_margin = completed_margin.min(t.expires_at(s.end) - s.end);
                }
            }
        }
    }
    completed_margin
}

/// (b) The fenced store never accepted a fence older than one it had accepted before.
fn the_store_accepted_no_stale_fence(f: &Facts<'_>, r: &mut Report) {
    let mut last_fence = 0u64;
    for &(fence, _) in &f.log {
        if fence < last_fence {
            r.fail(
                "b",
                format!("the store accepted fence {fence} after {last_fence}"),
            );
        }
        last_fence = last_fence.max(fence);
    }
}

/// (b) Accepted write n wrote n: each read-modify-write saw the one before it.
fn no_accepted_increment_was_lost(f: &Facts<'_>, r: &mut Report) -> usize {
    // Without fencing (Redlock), a process stopped after its body checked `is_lost()` and
    // before its write went out writes late, after the next holders: the limit GUARANTEES.md
    // states (`faults::limits::without_fencing_...`). Such a write is one its worker could not
    // see accepted, and it goes back to the value it read. Each is excused once, by a register
    // section of a worker stopped during it whose write it never saw answered.
    let late_writers = if f.i.fencing {
        0
    } else {
        f.secs
            .iter()
            .filter(|s| {
                s.on_register()
                    && matches!(s.write, StoreCall::InFlight | StoreCall::Failed)
                    && f.paused_during(s.worker, s.start, s.end)
            })
            .count()
    };
    let mut late = 0;
    let mut previous = 0;
    for (n, &(_, value)) in f.log.iter().enumerate() {
        if value != previous + 1 {
            if value <= previous && late < late_writers {
                late += 1;
            } else {
                r.fail(
                    "b",
                    format!(
                        "accepted write #{} wrote {value} after {previous}: an increment was lost",
                        n + 1
                    ),
                );
            }
        }
        previous = value;
    }
    late
}

/// (b) The register holds one increment per accepted write, less those a late write of a
/// stopped process overwrote (see [`no_accepted_increment_was_lost`]): the last value written.
fn the_register_counts_every_accepted_increment(f: &Facts<'_>, late: usize, r: &mut Report) {
    let accepted = f.accepted();
    let last = f.log.last().map_or(0, |&(_, value)| value);
    if f.i.register != last || (late == 0 && last != accepted) {
        r.fail(
            "b",
            format!(
                "register {} != {accepted} accepted increments (last written {last}, {late} late \
                 writes of stopped processes)",
                f.i.register
            ),
        );
    }
}

/// (b) The store accepted every write a worker saw accepted, and besides those only writes
/// whose outcome their worker could not know (in flight, failed, or killed).
fn the_store_accepted_what_the_workers_saw(f: &Facts<'_>, r: &mut Report) {
    let accepted = f.accepted();
    let acc_seen = i64::try_from(
        f.secs
            .iter()
            .filter(|s| s.write == StoreCall::Accepted)
            .count(),
    )
    .expect("fits");
    let unsure = i64::try_from(
        f.secs
            .iter()
            .filter(|s| {
                matches!(s.write, StoreCall::InFlight | StoreCall::Failed)
                    || s.outcome == Ending::Killed
            })
            .count(),
    )
    .expect("fits");
    if accepted < acc_seen || accepted > acc_seen + unsure {
        r.fail(
            "b",
            format!("the store holds {accepted} accepted writes; workers saw {acc_seen} (+{unsure} unsure)"),
        );
    }
}

/// (b) No fencing token was handed to two sections.
fn no_fencing_token_is_handed_out_twice(f: &Facts<'_>, r: &mut Report) {
    let mut fences: HashMap<u64, usize> = HashMap::new();
    for s in f.secs.iter().filter(|s| s.on_register()) {
        *fences.entry(s.fence).or_default() += 1;
    }
    if let Some((fence, n)) = fences.iter().find(|(_, n)| **n > 1) {
        r.fail(
            "b",
            format!("fencing token {fence} was handed to {n} sections"),
        );
    }
}

/// (b) Fencing tokens strictly increase in the order the server (the first node) granted the
/// lock to their sections.
fn fencing_tokens_increase_in_the_servers_order_of_holders(f: &Facts<'_>, r: &mut Report) {
    let by_token = f.i.histories[0].by_token();
    // Each section's fence belongs to the tenure its body ran in: the token's last tenure
    // begun by its start. An earlier tenure of the same token (an acquisition whose reply was
    // lost, retried with the same token) took a fence of its own, which no section reports.
    let mut order: Vec<(i64, u64)> = f
        .secs
        .iter()
        .filter(|s| s.on_register())
        .filter_map(|s| {
            let tenure = by_token
                .get(s.token.as_str())?
                .iter()
                .filter(|t| t.key == f.register && t.since_us <= s.start)
                .max_by_key(|t| t.since_us)?;
            Some((tenure.since_us, s.fence))
        })
        .collect();
    order.sort_unstable();
    order.dedup_by_key(|(_, fence)| *fence);
    if let Some(w) = order.windows(2).find(|w| w[1].1 <= w[0].1) {
        r.fail(
            "b",
            format!("fencing token {} was granted after {}", w[1].1, w[0].1),
        );
    }
}

/// What the hand-over check measured.
struct HandOvers {
    /// Hand-overs judged.
    judged: usize,
    /// Hits of a holder not judged: another fault began before the lock could be free, and
    /// may have delayed it.
    unjudged: usize,
    /// Among them, of the election's key.
    new_terms: usize,
    /// The slowest hand-over after a hit holder (µs), of those not excused as starved.
    slowest: i64,
    /// Hand-overs later than the bound by no more than a server was seen kept off the CPU
    /// meanwhile, and the slowest of them (µs).
    starved: usize,
    slowest_excused: i64,
    /// The first node's tenures around each hand-over that was too slow.
    late_tenures: Vec<String>,
}

/// (c) After a holder was killed or stopped while it held the lock (the register's, or the
/// election's: a leader in its term), another owner, alive and running, took the lock on a
/// quorum of nodes within ttl + [`FREE_BOUND`], unless the next fault began first (counted as
/// unjudged in the summary). A hand-over later than that by no more than a server was seen
/// kept off the CPU between the lease's end and the hand-over ([`Facts::kept_off_the_cpu`]) is
/// excused, and counted in the summary. A lock handed to a waiter of a process that is dead or stopped itself is
/// not taken. Judged from the servers' history: a body may start a moment later, or never, if
/// that owner is hit by the next fault.
fn the_lock_is_handed_over_soon_after_its_holder_is_hit(
    f: &Facts<'_>,
    r: &mut Report,
) -> HandOvers {
    let mut out = HandOvers {
        judged: 0,
        unjudged: 0,
        new_terms: 0,
        slowest: 0,
        starved: 0,
        slowest_excused: 0,
        late_tenures: Vec::new(),
    };
    for hit in f.i.faults.iter().filter(|fault| fault.held) {
        let victim = hit.victim_token.as_deref().expect("client fault");
        let key = hit.key.as_deref().unwrap_or(&f.register);
        let window = hit.start_us + us(TTL + FREE_BOUND);
        if f.i
            .faults
            .iter()
            .any(|g| g.start_us > hit.start_us && g.start_us < window)
        {
            // Another fault began before the lock could be free: a late hand-over may be its
            // doing. Counted for the summary, so a run that judged none says so.
            out.unjudged += 1;
            continue;
        }
        let mut next_by_node: Vec<(i64, &str)> =
            f.i.histories
                .iter()
                .filter_map(|h| {
                    h.tenures
                        .iter()
                        .filter(|t| t.key == key && t.token != victim)
                        .filter(|t| t.since_us > hit.start_us && f.alive_at(&t.token, t.since_us))
                        .map(|t| (t.since_us, t.token.as_str()))
                        .min()
                })
                .collect();
        next_by_node.sort_unstable();
        let Some(&(next, _)) = next_by_node.get(f.i.quorum - 1) else {
            r.fail("c", format!("nobody held {key} again after {}", hit.kind));
            continue;
        };
        let waited = f.elapsed(hit.start_us, next);
        out.judged += 1;
        if f.secs
            .iter()
            .any(|s| s.kind == LockKind::Leader && s.keys.iter().any(|k| k == key))
        {
            out.new_terms += 1;
        }
        // Until the holder's lease ran out nobody could take the lock: a stall over that
        // stretch delays nothing.
        let free_from = hit.start_us + hit.pttl_ms.max(0) * 1000;
        let starved = f.kept_off_the_cpu(free_from, next);
        if waited > us(TTL + FREE_BOUND) && waited <= us(TTL + FREE_BOUND) + starved {
            out.starved += 1;
            out.slowest_excused = out.slowest_excused.max(waited);
            continue;
        }
        out.slowest = out.slowest.max(waited);
        if waited > us(TTL + FREE_BOUND) {
            r.fail(
                "c",
                format!(
                    "after {} of the holder of {key} at {} (its lease had {} ms left), another owner took it {} ms later (bound {} ms, and {} ms seen kept off the CPU)",
                    hit.kind,
                    hit.start_us,
                    hit.pttl_ms,
                    waited / 1000,
                    (TTL + FREE_BOUND).as_millis(),
                    starved / 1000
                ),
            );
            out.late_tenures.extend(
                f.i.histories[0]
                    .tenures
                    .iter()
                    .filter(|t| t.key == key)
                    .filter(|t| t.since_us > hit.start_us - 2_000_000 && t.since_us <= next)
                    .map(|t| {
                        format!(
                            "    tenure {} from {} to {:?} ({})",
                            t.token, t.since_us, t.ended_us, t.ended_by
                        )
                    }),
            );
        }
    }
    out
}

/// (d) No client renewed, deleted or shortened a lock it did not own, nor did anything else the
/// model of a node's history cannot explain (every finding of the model but `(f)`).
fn no_client_touched_a_lock_it_did_not_own(f: &Facts<'_>, r: &mut Report) {
    for h in f.i.histories {
        for v in h.violations.iter().filter(|v| !v.starts_with("(f)")) {
            // The model names its own invariant where it knows it; the report adds it once.
            r.fail("d", v.strip_prefix("(d) ").unwrap_or(v).to_owned());
        }
    }
}

/// (f) Every lock key always had a TTL: no command in a node's history left one without, and
/// no key is left without one at the end.
fn every_lock_key_has_a_ttl(f: &Facts<'_>, r: &mut Report) {
    for h in f.i.histories {
        for v in h.violations.iter().filter_map(|v| v.strip_prefix("(f) ")) {
            r.fail("f", v.to_owned());
        }
    }
    for k in f.i.leftover_without_ttl {
        r.fail("f", format!("lock key without TTL at the end: {k}"));
    }
}

/// (a) With `on_lost = cancel` (every task but the register's `.1`), a body that finished while
/// its lease was already lost made `run()` return `Err(Lost)`, never `Ok`: the caller must not
/// believe the work ran under the lock.
fn cancel_mode_bodies_never_return_ok_after_a_loss(f: &Facts<'_>, r: &mut Report) {
    for s in f
        .secs
        .iter()
        .filter(|s| s.outcome.ok() && s.lost_seen && s.cancels())
    {
        r.fail(
            "a",
            format!(
                "{} fence {}: run() returned Ok although CurrentLock::is_lost() was true when the body finished",
                s.task, s.fence
            ),
        );
    }
}

/// Every worker that the test did not kill exited with status 0 (a panic or an abort in the
/// library would otherwise pass unseen).
fn every_worker_exited_cleanly(f: &Facts<'_>, r: &mut Report) {
    for bad in f.i.bad_exits {
        r.fail("run", format!("a worker did not exit cleanly: {bad}"));
    }
}

/// The run exercised what its checks claim: enough sections, cancelled bodies, hand-overs,
/// renewals and faults that hit a holder. A check that passed over nothing proves nothing.
fn the_run_exercised_what_it_claims(
    f: &Facts<'_>,
    hand_overs: &HandOvers,
    cancels: &Cancels<'_>,
    r: &mut Report,
) {
    let m = f.i.minimums;
    let renewals: usize = f.i.histories.iter().map(|h| h.renewals).sum();
    let holder_hits = f.i.faults.iter().filter(|fault| fault.held).count();
    let asking: usize = f.i.histories.iter().map(|h| h.asking).sum();
    let of_kind = |kind: LockKind| f.secs.iter().filter(|s| s.kind == kind).count();
    for (what, seen, least) in [
        ("critical sections", f.secs.len(), m.sections),
        (
            "critical sections of the register",
            of_kind(LockKind::Lock),
            m.register,
        ),
        ("sections of readers", of_kind(LockKind::Read), m.per_kind),
        (
            "sections of writers beside readers",
            of_kind(LockKind::Write),
            m.per_kind,
        ),
        (
            "sections holding a permit",
            of_kind(LockKind::Permit),
            m.per_kind,
        ),
        (
            "sections holding several keys",
            of_kind(LockKind::Multi),
            m.per_kind,
        ),
        ("terms of a leader", of_kind(LockKind::Leader), m.per_kind),
        (
            "cancelled bodies checked by (e)",
            cancels.checked,
            m.cancelled,
        ),
        ("hand-overs judged by (c)", hand_overs.judged, m.hand_overs),
        (
            "new terms after a leader's crash judged by (c)",
            hand_overs.new_terms,
            m.new_terms,
        ),
        ("renewals", renewals, m.renewals),
        ("faults that hit the holder", holder_hits, m.holder_hits),
        ("commands that followed an ASK", asking, m.asking),
    ] {
        if seen < least {
            r.fail(
                "run",
                format!("the run exercised too little: {seen} {what}, at least {least} wanted"),
            );
        }
    }
}

/// What the cancel check measured.
struct Cancels<'s> {
    /// The smallest lease left on a quorum when a cancelled body stopped (µs).
    smallest_margin: i64,
    /// Cancelled bodies checked.
    checked: usize,
    /// Bodies lost while their own process was stopped: out of any lock's reach.
    paused: Vec<&'s Section>,
    /// Bodies stopped after their key expired while their process was kept off the CPU past
    /// the drift allowance: as out of reach as a stopped one (no timer runs on time there).
    starved: Vec<(&'s Section, i64)>,
    /// Bodies stopped within a ttl after a jump forward of the wall clock passed over their
    /// key's expiry (see [`ClockStep`]).
    jumped: Vec<&'s Section>,
}

/// (e) A body with `on_lost = cancel` that was reported lost stopped before its key (each of
/// its keys) expired on a quorum of nodes, and before its tenure there ended any other way
/// (deleted, taken by another, lost with its server). A late stop after an expiry is excused
/// only where the library's timer could not run: its own process stopped (SIGSTOP) at some
/// moment from when the timer was due (the drift allowance before the expiry) to the body's
/// end, or its runtime seen (by its heartbeat) kept off the CPU over all of that span; or a jump
/// forward of the wall clock passed over the key's expiry and the body stopped within a ttl
/// after it. A tenure that ended early is no timer's to notice: never excused.
fn cancelled_bodies_stop_before_their_key_expires<'s>(
    f: &'s Facts<'_>,
    r: &mut Report,
) -> Cancels<'s> {
    let mut out = Cancels {
        smallest_margin: i64::MAX,
        checked: 0,
        paused: Vec::new(),
        starved: Vec::new(),
        jumped: Vec::new(),
    };
    for s in f.secs.iter().filter(|s| s.outcome.lost() && s.cancels()) {
        // Of each key, the margin a quorum of nodes still had (and whether it ran out by the
        // tenure's early end, not its expiry); of the lock, its smallest key's. A grant no
        // history shows (see `hidden_grant`) expires a ttl after the earliest moment it can
        // have come, at the soonest.
        let margin = s
            .keys
            .iter()
            .map(|key| {
                let tenures: Vec<Vec<&model::Tenure>> = f.tenures_of(&s.token, key).collect();
                let shown = tenures.iter().flatten().map(|t| t.since_us).min();
                let mut margins: Vec<(i64, Option<&'static str>)> = tenures
                    .iter()
                    .zip(f.i.histories)
                    .filter_map(|(ts, history)| {
                        ts.iter()
                            .filter(|t| t.since_us <= s.end)
                            .map(|t| tenure_margin(t, s.end))
                            .max()
                            .or_else(|| {
                                hidden_grant(s, shown, history)
                                    .map(|(granted, _)| (granted + us(TTL) - s.end, None))
                            })
                    })
                    .collect();
                margins.sort_unstable_by(|a, b| b.cmp(a));
                margins.get(f.i.quorum - 1).copied()
            })
            .collect::<Option<Vec<(i64, Option<&'static str>)>>>()
            .and_then(|margins| margins.into_iter().min());
        let Some((margin, early)) = margin else {
            r.fail(
                "e",
                format!("{} fence {}: no server-side tenure", s.task, s.fence),
            );
            continue;
        };
        if margin <= 0 {
            if let Some(why) = early {
                r.fail(
                    "e",
                    format!(
                        "{} fence {} ({}) stopped at {}, {} µs after its tenure ended ({why})",
                        s.task, s.fence, s.outcome, s.end, -margin
                    ),
                );
                out.checked += 1;
                continue;
            }
            // The wall clock jumped over the expiry: the body stopped at its next renewal.
            let expiry = s.end + margin;
            if f.i
                .clock_steps
                .iter()
                .any(|jump| jump.passed(expiry) && s.end <= jump.after_us + us(TTL))
            {
                out.jumped.push(s);
                continue;
            }
            let due = s.end + margin - us(DRIFT);
            if f.paused_during(s.worker, due, s.end) {
                out.paused.push(s);
                continue;
            }
            // Excused only for a body that was running when the timer was due: the library
            // never starts one whose lease has already run out.
            if s.start < due && f.starved(s.worker, due, s.end) {
                out.starved.push((s, margin));
                continue;
            }
        }
        out.checked += 1;
        out.smallest_margin = out.smallest_margin.min(margin);
        if margin <= 0 {
            r.fail(
                "e",
                format!(
                    "{} fence {} ({}) stopped at {}, {} µs after its key expired",
                    s.task, s.fence, s.outcome, s.end, -margin
                ),
            );
        }
    }
    out
}

/// A tenure's lease left at `end` (µs), and why it ran out where that was not its expiry: an
/// end before `end` (deleted, taken, lost with its server) that came before the expiry. An end
/// after `end` (its own release) leaves the expiry as the margin.
fn tenure_margin(t: &model::Tenure, end: i64) -> (i64, Option<&'static str>) {
    let expiry = t.expires_at(end);
    match t.ended_us {
        Some(ended) if ended <= end && ended < expiry => (ended - end, Some(t.ended_by)),
        _ => (expiry - end, None),
    }
}

/// What the drop check measured.
struct Drops {
    count: usize,
    /// The slowest drop (µs).
    slowest: i64,
}

/// (g) Dropping a guard or a guarded future returned within [`DROP_BOUND`], whatever the network
/// did.
fn drops_never_block_the_runtime(f: &Facts<'_>, r: &mut Report) -> Drops {
    let mut out = Drops {
        count: 0,
        slowest: 0,
    };
    for line in f.i.lines {
        let Record::Drop { took_us, .. } = line.record else {
            continue;
        };
        out.count += 1;
        let took = i64::try_from(took_us).expect("fits");
        out.slowest = out.slowest.max(took);
        if took > us(DROP_BOUND) {
            r.fail(
                "g",
                format!(
                    "a drop blocked the runtime for {took} µs: {}",
                    line.record.line()
                ),
            );
        }
    }
    out
}

/// (g) The worker's heartbeat never ran more than [`STALL_BOUND`] late, except while the worker
/// itself was stopped. Returns the worst delay (µs).
fn the_runtime_never_stalls(f: &Facts<'_>, r: &mut Report) -> i64 {
    let mut worst_stall = 0i64;
    for line in f.i.lines {
        let Record::Stall { at, late_us, .. } = line.record else {
            continue;
        };
        let late = i64::try_from(late_us).expect("fits");
        if f.paused_during(line.worker, at - late, at) {
            continue;
        }
        worst_stall = worst_stall.max(late);
        if late > us(STALL_BOUND) {
            r.fail("g", format!("the runtime stalled: {}", line.record.line()));
        }
    }
    worst_stall
}

/// What the checks measured, for the summary.
struct Figures<'s> {
    completed_margin: i64,
    hand_overs: HandOvers,
    cancels: Cancels<'s>,
    drops: Drops,
    worst_stall: i64,
    /// Writes of stopped processes accepted late, without fencing (see (b)).
    late_writes: usize,
    violations: usize,
}

/// The run in figures, and the limits it met, for the test's output.
fn summary(f: &Facts<'_>, figures: &Figures<'_>) -> Vec<String> {
    let i = f.i;
    let secs = &f.secs;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for s in secs {
        *outcomes.entry(s.outcome.to_string()).or_default() += 1;
    }
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for line in i.lines {
        if let Record::Err { outcome, .. } = line.record {
            *errors.entry(format!("acquire-{outcome}")).or_default() += 1;
        }
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in i.faults {
        *kinds.entry(fault.kind.as_str()).or_default() += 1;
    }
    let ms = |v: i64| {
        if v == i64::MAX {
            "n/a".to_owned()
        } else {
            format!("{:.1} ms", v as f64 / 1000.0)
        }
    };
    let long: Vec<&Section> = secs
        .iter()
        .filter(|s| u128::from(s.hold_ms) >= TTL.as_millis())
        .collect();
    let long_kept = long
        .iter()
        .filter(|s| s.outcome.ok() && !s.lost_seen)
        .count();
    let long_lost = long.iter().filter(|s| s.outcome.lost()).count();
    let long_continued = long
        .iter()
        .filter(|s| s.outcome.ok() && s.lost_seen)
        .count();
    let holder_hits = i.faults.iter().filter(|fault| fault.held).count();
    let Figures {
        completed_margin,
        hand_overs,
        cancels,
        drops,
        worst_stall,
        late_writes,
        violations,
    } = figures;
    let renewals: usize = i.histories.iter().map(|h| h.renewals).sum();
    let commands: usize = i.histories.iter().map(|h| h.commands).sum();
    let scripts: usize = i.histories.iter().map(|h| h.scripts).sum();
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for s in secs {
        *by_kind.entry(s.kind.name()).or_default() += 1;
    }
    let mut lines = vec![
        format!("mode: {}", i.name),
        format!("critical sections: {} {by_kind:?}", secs.len()),
        format!("lock kinds: {}", by_kind.len()),
        format!("fault kinds: {}", kinds.len()),
        format!("violations: {violations}"),
        format!("fault-injection summary ({}, ttl {} ms, ran {:.1} s)", i.name, TTL.as_millis(), i.ran_for.as_secs_f64()),
        format!(
            "  operations: {} critical sections {:?}; {} acquisitions failed {:?}; {} guard/future drops",
            secs.len(),
            outcomes,
            errors.values().sum::<usize>(),
            errors,
            drops.count
        ),
        format!(
            "  bodies longer than the ttl: {} kept their lease through renewal, {} were cancelled on loss, {} (on_lost = continue) finished after the loss was reported",
            long_kept, long_lost, long_continued
        ),
        format!(
            "  server saw: {} client commands, {} script calls, {} renewals, {} commands that followed an ASK; {} server losses and {} gaps in a live server's history; the fenced store accepted {} writes (register {}) and refused {} stale operations",
            commands, scripts, renewals, i.histories.iter().map(|h| h.asking).sum::<usize>(), i.histories.iter().map(|h| h.server_losses).sum::<usize>(), i.histories.iter().map(|h| h.gaps).sum::<usize>(), f.accepted(), i.register, i.rejected
        ),
        format!(
            "  faults injected: {} {:?}; proxy dropped {} reply chunks, reset {} connections; {} hit the lock holder",
            i.faults.len(),
            kinds,
            i.proxy.0,
            i.proxy.1,
            holder_hits
        ),
        format!(
            "  (a) {} losses recorded while their worker was kept off the CPU, judged up to where it was last seen on time",
            f.losses_seen_in_a_stall()
        ),
        format!(
            "  (e) smallest cancel margin: {} over {} cancelled bodies; smallest margin of a completed section: {}",
            ms(cancels.smallest_margin),
            cancels.checked,
            ms(*completed_margin)
        ),
        format!(
            "  (c) slowest of {} hand-overs after a holder crash/stop ({} of them new terms after a leader's crash): {} (bound: ttl + {} ms); {} hits of a holder not judged (another fault began within the bound); {} later, by less than a server was kept off the CPU meanwhile (slowest {}); a server's pulse at worst {} late (its own faults included)",
            hand_overs.judged,
            hand_overs.new_terms,
            ms(hand_overs.slowest),
            FREE_BOUND.as_millis(),
            hand_overs.unjudged,
            hand_overs.starved,
            ms(hand_overs.slowest_excused),
            ms(f.i
                .histories
                .iter()
                .flat_map(|h| &h.pulse_stalls)
                .map(|(_, due, ran)| ran - due)
                .max()
                .unwrap_or(0))
        ),
        format!(
            "  (g) slowest drop: {}; worst heartbeat delay outside a worker's own SIGSTOP: {}",
            ms(drops.slowest),
            if *worst_stall == 0 { format!("under {}", ms(us(Record::LATE))) } else { ms(*worst_stall) }
        ),
        format!(
            "  limits seen: {} bodies of stopped processes ran past their lease (no lock can stop a paused process; only fencing refuses their late writes)",
            cancels.paused.len(),
        ),
        format!(
            "  limits seen: {} cancelled bodies stopped after their key expired while their process was kept off the CPU (its heartbeat late from the cancel's time on)",
            cancels.starved.len(),
        ),
        format!(
            "  limits seen: {} late writes of stopped processes accepted without fencing (an update lost: what fencing tokens are for)",
            late_writes,
        ),
    ];
    let forward: Vec<i64> = i
        .clock_steps
        .iter()
        .map(|jump| jump.moved_us)
        .filter(|&moved| moved > 0)
        .collect();
    lines.push(format!(
        "  limits seen: the wall clock jumped forward {} times (by up to {}): {} sections whose leases it ran out judged up to it, {} cancelled bodies stopped after it (a server's clock jumping forward expires its keys early)",
        forward.len(),
        ms(forward.iter().copied().max().unwrap_or(0)),
        f.judged_up_to_a_jump(),
        cancels.jumped.len(),
    ));
    for step in i.clock_steps {
        lines.push(format!(
            "    the wall clock jumped {} between readings at {} and {}",
            ms(step.moved_us),
            step.before_us,
            step.after_us
        ));
    }
    for (s, margin) in &cancels.starved {
        lines.push(format!(
            "    {} fence {}: stopped {} after its key expired",
            s.task,
            s.fence,
            ms(-margin)
        ));
    }
    lines.extend(hand_overs.late_tenures.iter().cloned());
    for s in &cancels.paused {
        lines.push(format!(
            "    {} fence {}: {} after {:.0} ms, lost_seen={}, write={}",
            s.task,
            s.fence,
            s.outcome,
            (s.end - s.start) as f64 / 1000.0,
            u8::from(s.lost_seen),
            s.write
        ));
    }
    lines
}

pub fn print_summary(r: &Report) {
    // Written to the process's stderr directly: libtest captures print!/eprint! of passing tests.
    let mut err = std::io::stderr().lock();
    for line in &r.lines {
        let _ = writeln!(err, "{line}");
    }
    for v in &r.violations {
        let _ = writeln!(err, "  VIOLATION {v}");
    }
}

/// MONITOR lines, parsed as the monitor parses what a server sends.
#[cfg(test)]
fn monitored<S: AsRef<str>>(lines: impl IntoIterator<Item = S>) -> Vec<super::monitor::Event> {
    lines
        .into_iter()
        .map(|l| {
            let line = format!("{}\r\n", l.as_ref());
            super::monitor::Event::Command(
                super::monitor::parse_line(line.as_bytes()).expect("a MONITOR line"),
            )
        })
        .collect()
}

/// A critical section of a synthetic run, to write as its worker would: by default a section
/// of the register's lock (seq 1) that returned `Ok` with its write accepted.
#[cfg(test)]
struct Synthetic {
    worker: u32,
    w: &'static str,
    seq: u64,
    token: &'static str,
    fence: u64,
    called: i64,
    start: i64,
    end: i64,
    outcome: Outcome,
    lost_seen: bool,
    lost_at: Option<i64>,
    write: StoreCall,
    kind: LockKind,
    keys: &'static [&'static str],
}

#[cfg(test)]
impl Synthetic {
    /// Task `w` of `worker` held `token` with `fence` over `[start, end]`.
    fn new(
        worker: u32,
        w: &'static str,
        token: &'static str,
        fence: u64,
        (start, end): (i64, i64),
    ) -> Self {
        Self {
            worker,
            w,
            seq: 1,
            token,
            fence,
            called: start,
            start,
            end,
            outcome: Outcome::Ok,
            lost_seen: false,
            lost_at: None,
            write: StoreCall::Accepted,
            kind: LockKind::Lock,
            keys: &["lock:register"],
        }
    }

    fn keys(&self) -> Vec<String> {
        self.keys.iter().map(|&k| k.to_owned()).collect()
    }

    /// Its acquisition called at `called` (by default when the section began).
    fn called_at(mut self, called: i64) -> Self {
        self.called = called;
        self
    }

    /// Its `begin` record.
    fn begin(&self) -> Line {
        Line {
            worker: self.worker,
            record: Record::Begin {
                w: self.w.to_owned(),
                seq: self.seq,
                token: self.token.to_owned(),
                fence: self.fence,
                called: self.called,
                start: self.start,
                kind: self.kind,
                keys: self.keys(),
                hold_ms: 0,
            },
        }
    }

    /// Its `end` record.
    fn end(&self) -> Line {
        Line {
            worker: self.worker,
            record: Record::End {
                w: self.w.to_owned(),
                seq: self.seq,
                token: self.token.to_owned(),
                fence: self.fence,
                start: self.start,
                end: self.end,
                outcome: self.outcome,
                lost_seen: self.lost_seen,
                lost_at: self.lost_at,
                read: StoreCall::Accepted,
                write: self.write,
                kind: self.kind,
                keys: self.keys(),
            },
        }
    }
}

#[test]
fn the_checks_catch_overlaps_lost_increments_slow_hand_overs_late_cancels_blocking_drops_and_idle_runs(
) {
    let first = Synthetic::new(1, "1.0", "h:1:a", 1, (10_000_100, 10_500_000));
    let lines = [
        first.begin(),
        first.end(),
        // Overlaps the first, and the server never gave it the lock.
        Synthetic::new(2, "2.0", "h:2:b", 2, (10_400_000, 10_600_000)).end(),
        // Cancelled half a second after its key expired.
        Synthetic {
            seq: 2,
            outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
            write: StoreCall::NotMade,
            ..Synthetic::new(2, "2.0", "h:2:c", 3, (12_000_100, 13_500_000))
        }
        .end(),
        Line {
            worker: 1,
            record: Record::Drop {
                w: "1".into(),
                at: 14_000_000,
                dropped: lock_tests::records::Dropped::Guard,
                took_us: 200_000,
            },
        },
        // A cancel-mode body that saw its loss, and yet run() returned Ok.
        Synthetic {
            seq: 2,
            lost_seen: true,
            write: StoreCall::NotMade,
            ..Synthetic::new(1, "1.0", "h:1:d", 4, (15_000_000, 15_000_100))
        }
        .end(),
    ];
    let events = monitored([
        r#"+10.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:register" "fence:{lock:register}" "h:1:a" "1000" "1""#,
        r#"+10.000010 [0 lua] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#,
        r#"+10.000020 [0 lua] "INCR" "fence:{lock:register}""#,
        r#"+12.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:register" "fence:{lock:register}" "h:2:c" "1000" "1""#,
        r#"+12.000010 [0 lua] "SET" "lock:register" "h:2:c" "NX" "PX" "1000""#,
        r#"+12.000020 [0 lua] "INCR" "fence:{lock:register}""#,
    ]);
    let histories = [model::rebuild(&[events], "lock:", false)];
    let faults = [FaultRecord {
        kind: "client-kill-9".into(),
        start_us: 20_000_000,
        end_us: 20_000_000,
        victim: Some(1),
        held: true,
        pttl_ms: 1000,
        victim_token: Some("h:1:z".into()),
        key: None,
    }];
    let log = ["1:1".to_owned(), "2:1".to_owned()];
    let report = check(&Inputs {
        minimums: Minimums {
            sections: 100,
            register: 50,
            ..Minimums::NONE
        },
        bad_exits: &["worker 3: exit status: 101".to_owned()],
        faults: &faults,
        register: 1,
        log: &log,
        ..Inputs::synthetic(&lines, &histories)
    });
    let all = report.violations.join("\n");
    for expected in [
        "(a) sections overlap",
        "(a) 2.0 (lock) fence 2",
        "(b) accepted write #2 wrote 1",
        "(b) register 1 != 2",
        "(c) nobody held lock:register again",
        "(e) 2.0 fence 3",
        "(g) a drop blocked the runtime",
        "(a) 1.0 fence 4: run() returned Ok although",
        "(run) a worker did not exit cleanly: worker 3",
        "(run) the run exercised too little: 4 critical sections, at least 100 wanted",
        "(run) the run exercised too little: 4 critical sections of the register, at least 50 wanted",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
}

#[test]
fn a_section_is_trusted_while_a_quorum_holds_it_even_if_the_nodes_change_midway() {
    // Node 1's grant lands just after the section began; node 2 is lost in the middle.
    let lines = [Synthetic::new(1, "1.1", "h:1:a", 0, (10_001_000, 11_500_000)).end()];
    let node = |events: &[&[String]]| -> History {
        model::rebuild(
            &[monitored(events.iter().copied().flatten())],
            "lock:",
            false,
        )
    };
    let grant = |at: &str| {
        [
            format!(
                r#"+{at}00 [0 127.0.0.1:1] "evalsha" "s" "1" "lock:register" "h:1:a" "1000" "0""#
            ),
            format!(r#"+{at}10 [0 lua] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#),
        ]
    };
    let renew = |at: &str| {
        [
            format!(r#"+{at}00 [0 127.0.0.1:1] "evalsha" "r" "1" "lock:register" "h:1:a" "1000""#),
            format!(r#"+{at}10 [0 lua] "GET" "lock:register""#),
            format!(r#"+{at}20 [0 lua] "PEXPIRE" "lock:register" "1000""#),
        ]
    };
    let (early, late, renewed) = (grant("10.0005"), grant("10.0020"), renew("10.6000"));
    let check_with = |histories: &[History]| {
        check(&Inputs {
            quorum: 2,
            fencing: false,
            log: &["0:1".to_owned()],
            register: 1,
            ..Inputs::synthetic(&lines, histories)
        })
        .violations
    };
    let held = [
        node(&[&early, &renewed]),
        node(&[&late, &renewed]),
        node(&[&early]),
    ];
    assert_eq!(check_with(&held), Vec::<String>::new());
    // Without node 2 the section's first moment had one holder only.
    let gap = [
        node(&[&early, &renewed]),
        node(&[&late, &renewed]),
        node(&[]),
    ];
    let violations = check_with(&gap).join("\n");
    assert!(
        violations.contains("(a) 1.1 (lock) fence 0") && violations.contains("on a quorum"),
        "{violations}"
    );
}

/// Redlock over three nodes: node 0 shows the grant, node 1 refused, and node 2 was killed
/// (and restarted empty after a ttl) right after the same attempt reached node 0.
#[test]
fn a_node_killed_right_after_it_may_have_granted_counts_while_it_is_down() {
    let lines = [Synthetic::new(1, "1.1", "h:1:a", 0, (10_003_000, 10_006_000)).end()];
    let grant = [
        r#"+10.000500 [0 127.0.0.1:1] "evalsha" "s" "1" "lock:register" "h:1:a" "1000" "0""#,
        r#"+10.000510 [0 lua] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#,
    ];
    let other = |at: &str| [format!(r#"+{at} [0 127.0.0.1:2] "GET" "lock:other""#)];
    // Node 2's history shows its last command at `seen`, then its loss; back 1.4 s later.
    let killed = |seen: &str| {
        let mut events = monitored(other(seen));
        events.push(super::monitor::Event::Lost { at_us: 10_001_000 });
        events.extend(monitored(other("11.400000")));
        model::rebuild(&[events], "lock:", false)
    };
    let check_with = |node_2: History| {
        let histories = [
            model::rebuild(&[monitored(grant)], "lock:", false),
            model::rebuild(&[], "lock:", false),
            node_2,
        ];
        check(&Inputs {
            quorum: 2,
            fencing: false,
            log: &["0:1".to_owned()],
            register: 1,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .join("\n")
    };
    // Its output from 9.999 s until the kill at 10.001 s is lost: the grant may be in it.
    assert_eq!(check_with(killed("9.999000")), "");
    // It showed a command after the grant: the grant would show too.
    let violations = check_with(killed("10.000800"));
    assert!(violations.contains("on a quorum"), "{violations}");
}

/// A Cluster shard or Sentinel master (one copy of the data) killed right after it granted a
/// permit that no history shows: the acquisition was called at 10.0005 s, the body ran from
/// 10.003 s, and the master's output was lost from its last shown command until its loss was
/// seen at 10.004 s (a kept Cluster run at 9c438e8: called 758 µs before the kill, the body
/// began 2.9 ms after it, the master's output lost for 9 ms before, its replica's history
/// going on meanwhile).
#[test]
fn a_grant_no_history_shows_counts_if_it_may_have_fallen_in_a_killed_masters_lost_output() {
    let section = |end: i64| {
        let s = Synthetic {
            kind: LockKind::Permit,
            keys: &["lock:sem"],
            write: StoreCall::NotMade,
            ..Synthetic::new(1, "1.p", "h:1:a", 0, (10_003_000, end))
        }
        .called_at(10_000_500);
        [s.begin(), s.end()]
    };
    let other = |at: &str| [format!(r#"+{at} [0 127.0.0.1:2] "GET" "lock:other""#)];
    // The master's history shows its last command at `seen`, then its loss; back 1.4 s later.
    let master = |seen: &str| {
        let mut events = monitored(other(seen));
        events.push(super::monitor::Event::Lost { at_us: 10_004_000 });
        events.extend(monitored(other("11.400000")));
        events
    };
    let killed = |seen: &str| model::rebuild(&[master(seen)], "lock:", false);
    let check_with = |lines: &[Line], master: History| {
        let histories = [master];
        check(&Inputs {
            fencing: false,
            ..Inputs::synthetic(lines, &histories)
        })
        .violations
        .join("\n")
    };
    // Nothing shown from 9.999 s until the kill: the grant may be in the lost output.
    assert_eq!(check_with(&section(10_006_000), killed("9.999000")), "");
    // Commands shown after the call and before the body began: the grant may have come after
    // them (a Sentinel run kept at 3d3e513: the master showed commands until 4.6 ms after the
    // call, the kill came 143 µs later).
    assert_eq!(check_with(&section(10_006_000), killed("10.000800")), "");
    // A command shown after the body began: the grant, which came before, would show too.
    let violations = check_with(&section(10_006_000), killed("10.003500"));
    assert!(violations.contains("server-side tenure"), "{violations}");
    // Merged with its replica's history, whose commands after the body began say nothing of
    // what the master's lost output held.
    let group = model::rebuild(
        &[master("9.999000"), monitored(other("10.003500"))],
        "lock:",
        false,
    );
    assert_eq!(check_with(&section(10_006_000), group), "");
    // Merged with the other servers of a Cluster (one group), which run on after the loss:
    // their commands are not the killed master back (a kept Cluster run at 8c93767: a term
    // began 21 ms after its shard's master was killed, the other shards' commands going on).
    let cluster = model::rebuild(
        &[master("9.999000"), monitored(other("10.004500"))],
        "lock:",
        false,
    );
    assert_eq!(check_with(&section(10_006_000), cluster), "");
    // A hidden grant is a lease at most: a body still running a ttl after the call, unaware,
    // ran outside it (its renewals would have found the promoted replica without it).
    let violations = check_with(&section(11_200_000), killed("9.999000"));
    assert!(violations.contains("server-side tenure"), "{violations}");
}

/// (e) of a cancelled body whose grant no history shows (a Sentinel run kept at 267a4be: a
/// permit granted just before the master's `kill -9`, its body cancelled at its lease's end):
/// its key expired a ttl after the earliest moment the grant can have come, at the soonest.
#[test]
fn a_cancelled_body_whose_grant_no_history_shows_is_judged_from_its_earliest_grant() {
    let cancelled = |end: i64| {
        let s = Synthetic {
            kind: LockKind::Permit,
            keys: &["lock:sem"],
            write: StoreCall::NotMade,
            outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
            ..Synthetic::new(1, "1.p", "h:1:a", 0, (10_003_000, end))
        }
        .called_at(10_000_500);
        [s.begin(), s.end()]
    };
    let master = || {
        let mut events = monitored([r#"+9.999000 [0 127.0.0.1:2] "GET" "lock:other""#.to_owned()]);
        events.push(super::monitor::Event::Lost { at_us: 10_004_000 });
        model::rebuild(&[events], "lock:", false)
    };
    let check_with = |lines: &[Line]| {
        let histories = [master()];
        check(&Inputs {
            fencing: false,
            ..Inputs::synthetic(lines, &histories)
        })
        .violations
        .join("\n")
    };
    // Stopped 10.5 ms before a ttl after the call: no violation (it was "no server-side
    // tenure" before).
    assert_eq!(check_with(&cancelled(10_990_000)), "");
    // Stopped after it: a late cancel.
    let violations = check_with(&cancelled(11_010_000));
    assert!(violations.contains("after its key expired"), "{violations}");
}

/// A body granted at 10 s for a ttl that stopped 1 ms after its key expired (at 11.001 s: Redis
/// holds a key through the ms of its expiry), and the server's history of the grant.
fn late_cancel() -> (Synthetic, [model::History; 1]) {
    let cancelled = Synthetic {
        outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.0", "h:1:a", 1, (10_000_100, 11_002_000))
    };
    let histories = [model::rebuild(
        &[monitored([
            r#"+10.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:register" "fence:{lock:register}" "h:1:a" "1000" "1""#,
            r#"+10.000010 [0 lua] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#,
            r#"+10.000020 [0 lua] "INCR" "fence:{lock:register}""#,
        ])],
        "lock:",
        false,
    )];
    (cancelled, histories)
}

/// (e) of a body cancelled after its key expired: a limit of the machine, not a violation, only
/// when the worker's own heartbeat shows its runtime kept off the CPU from the moment the
/// library's timer was due (the drift allowance before the expiry) until the body ended.
#[test]
fn a_late_cancel_is_excused_only_by_a_stall_that_covers_it() {
    let (cancelled, histories) = late_cancel();
    let stall = |worker: u32, at: i64, late_us: u64| Line {
        worker,
        record: Record::Stall {
            w: worker.to_string(),
            at,
            late_us,
        },
    };
    let check_with = |stall: Option<Line>| {
        let mut lines = vec![cancelled.begin(), cancelled.end()];
        lines.extend(stall);
        let report = check(&Inputs {
            register: 0,
            ..Inputs::synthetic(&lines, &histories)
        });
        (report.violations.join("\n"), report.lines.join("\n"))
    };
    let late = "(e) 1.0 fence 1 (lost-expired) stopped at 11002000, 1000 µs after its key expired";
    // Its runtime ran nothing from before the timer was due (12 ms before the expiry) until
    // the body ended: excused, and shown as a limit seen.
    let (violations, lines) = check_with(Some(stall(1, 11_002_000, 14_000)));
    assert_eq!(violations, "");
    assert!(
        lines.contains("1 cancelled bodies stopped after their key expired while their process was kept off the CPU"),
        "{lines}"
    );
    let judged_late = |stall: Option<Line>| {
        let violations = check_with(stall).0;
        assert!(violations.contains(late), "{violations}");
    };
    // Late, but not by enough to explain a timer 13 ms late (a heartbeat due up to one period
    // after the timer was would be at least 3 ms late).
    judged_late(Some(stall(1, 11_002_000, 2_000)));
    // Long, but begun 13 ms after the timer was due (at the body's end): the timer had its
    // chance before it.
    judged_late(Some(stall(1, 11_016_000, 14_000)));
    // Long, but at another moment, or in another worker.
    judged_late(Some(stall(1, 10_500_000, 70_000)));
    judged_late(Some(stall(2, 11_002_000, 14_000)));
    // A body that began after its lease had run out is the library's doing, whatever the stall
    // (a fault run at fac0ee5: a leader elected while its process was stopped began its work
    // 1.5 s after its key expired).
    let begun_late = Synthetic {
        outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.0", "h:1:a", 1, (11_000_500, 11_002_000))
    };
    let lines = [
        begun_late.begin(),
        begun_late.end(),
        stall(1, 11_000_400, 500_000),
    ];
    let violations = check(&Inputs {
        register: 0,
        ..Inputs::synthetic(&lines, &histories)
    })
    .violations
    .join("\n");
    assert!(violations.contains("after its key expired"), "{violations}");
    judged_late(None);
}

/// (a) and (e) across a jump of the machine's wall clock: a jump forward runs out every lease
/// at once on the servers' clock, while the holders time theirs on the monotonic one and see
/// the loss only at their next renewal, and the next holder may get in before (the limit
/// GUARANTEES.md states). A section whose lease the jump ran out is judged up to the jump,
/// and a cancelled body that stopped within a ttl after it is a limit seen; a lease that ran
/// out before the jump, a body that went on longer, or a jump back, excuse nothing.
#[test]
fn a_lease_run_out_by_a_jump_of_the_wall_clock_is_judged_up_to_the_jump() {
    let histories = [model::rebuild(
        &[monitored([
            r#"+10.000000 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:register" "fence:{lock:register}" "h:1:a" "1000" "1""#,
            r#"+10.000010 [0 lua] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#,
            r#"+10.000020 [0 lua] "INCR" "fence:{lock:register}""#,
            // After the jump: the key is gone on the server's clock, and the next holder in.
            r#"+20.050000 [0 127.0.0.1:2] "evalsha" "s" "2" "lock:register" "fence:{lock:register}" "h:2:b" "1000" "1""#,
            r#"+20.050010 [0 lua] "SET" "lock:register" "h:2:b" "NX" "PX" "1000""#,
            r#"+20.050020 [0 lua] "INCR" "fence:{lock:register}""#,
        ])],
        "lock:",
        false,
    )];
    // Cancelled when its next renewal found the key gone, 100 ms after the jump.
    let cut_short = |end: i64| Synthetic {
        outcome: Outcome::Lost(lock_runtime::LostReason::Gone),
        lost_at: Some(end),
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.0", "h:1:a", 1, (10_000_100, end))
    };
    let next = Synthetic {
        write: StoreCall::NotMade,
        ..Synthetic::new(2, "2.0", "h:2:b", 2, (20_060_000, 20_070_000))
    };
    // The watch read the wall clock at 10.5 s, and 2 ms later at 20 s.
    let jump = |before_us: i64, after_us: i64| ClockStep {
        before_us,
        after_us,
        moved_us: after_us - before_us - 2_000,
    };
    let check_with = |first: &Synthetic, steps: &[ClockStep]| {
        let lines = [first.begin(), next.begin(), next.end(), first.end()];
        let report = check(&Inputs {
            register: 0,
            clock_steps: steps,
            ..Inputs::synthetic(&lines, &histories)
        });
        (report.violations.join("\n"), report.lines.join("\n"))
    };
    let judged_late = |first: &Synthetic, steps: &[ClockStep]| {
        let violations = check_with(first, steps).0;
        for found in [
            "sections overlap on lock:register",
            "1.0 (lock) fence 1 [10000100, ",
            "(e) 1.0 fence 1 (lost-gone) stopped at ",
        ] {
            assert!(violations.contains(found), "{found}: {violations}");
        }
    };
    // Unseen, the jump leaves a section that overlapped the next, ran past its tenure, and was
    // cancelled 9 s after its key expired.
    judged_late(&cut_short(20_100_000), &[]);
    let (violations, lines) = check_with(&cut_short(20_100_000), &[jump(10_500_000, 20_000_000)]);
    assert_eq!(violations, "");
    assert!(
        lines.contains("limits seen: the wall clock jumped forward 1 times (by up to 9498.0 ms): 1 sections whose leases it ran out judged up to it, 1 cancelled bodies stopped after it"),
        "{lines}"
    );
    // The body went on more than a ttl after the jump: the library's doing.
    judged_late(&cut_short(21_100_000), &[jump(10_500_000, 20_000_000)]);
    // The jump came after the key had expired (at 11.001 s): the body ran past it before.
    judged_late(&cut_short(20_100_000), &[jump(11_200_000, 20_000_000)]);
    // A jump before the lease began, or one back.
    judged_late(&cut_short(20_100_000), &[jump(9_000_000, 9_500_000)]);
    judged_late(
        &cut_short(20_100_000),
        &[ClockStep {
            before_us: 10_500_000,
            after_us: 20_000_000,
            moved_us: -50_000,
        }],
    );
}

/// (a) of a section that went on after its loss (`on_lost = "continue"`) and whose worker
/// recorded the loss after the key had expired: judged up to that record, it ran outside its
/// tenure, unless the worker's own heartbeat shows its runtime kept off the CPU over the moment
/// it recorded the loss: then the loss may have come any time in that stall, and the section is
/// judged up to where its runtime was last seen running on time (a Cluster run beside two CPU
/// hogs and a second test suite: a loss recorded 10 ms after the expiry, heartbeats up to 64 ms
/// late).
#[test]
fn a_loss_recorded_late_is_excused_only_by_a_stall_over_the_moment_it_was_recorded() {
    let (_, histories) = late_cancel();
    let went_on = Synthetic {
        outcome: Outcome::Ok,
        lost_seen: true,
        lost_at: Some(11_030_000),
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.1", "h:1:a", 1, (10_000_100, 11_500_000))
    };
    let stall = |at: i64, late_us: u64| Line {
        worker: 1,
        record: Record::Stall {
            w: "1".to_string(),
            at,
            late_us,
        },
    };
    let check_with = |stall: Option<Line>| {
        let mut lines = vec![went_on.begin(), went_on.end()];
        lines.extend(stall);
        let report = check(&Inputs {
            register: 0,
            ..Inputs::synthetic(&lines, &histories)
        });
        (report.violations.join("\n"), report.lines.join("\n"))
    };
    let outside = "ran outside its server-side tenure";
    let (violations, _) = check_with(None);
    assert!(violations.contains(outside), "{violations}");
    // A heartbeat due at 10.990 s ran when it recorded the loss (the one before ran on time,
    // up to one period earlier): judged up to 10.980 s.
    let (violations, lines) = check_with(Some(stall(11_030_500, 40_500)));
    assert_eq!(violations, "");
    assert!(
        lines.contains("1 losses recorded while their worker was kept off the CPU"),
        "{lines}"
    );
    // A stall that ended before the record, or whose runtime was seen on time after the key
    // expired, excuses nothing.
    for stall_at in [stall(11_020_000, 20_000), stall(11_030_500, 5_000)] {
        let (violations, _) = check_with(Some(stall_at));
        assert!(violations.contains(outside), "{violations}");
    }
}

/// A grant in a gap of a live server's history (its `MONITOR` connection closed by a Sentinel's
/// `CLIENT KILL`, see `monitor::Event::Gap`) counts as a lease, also after the gap: the server
/// kept it. A killed server's hidden grant ends when the server is back without it.
#[test]
fn a_grant_in_a_gap_of_a_live_servers_history_counts_after_the_gap_too() {
    let s = Synthetic {
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.0", "h:1:a", 0, (10_003_000, 10_500_000))
    }
    .called_at(10_000_500);
    let lines = [s.begin(), s.end()];
    let other = |at: &str| monitored([format!(r#"+{at} [0 127.0.0.1:2] "GET" "lock:other""#)]);
    let master = |broke: super::monitor::Event| {
        let mut events = other("9.999000");
        events.push(broke);
        events.extend(other("10.030000"));
        model::rebuild(&[events], "lock:", false)
    };
    let check_with = |history: History| {
        let histories = [history];
        check(&Inputs {
            fencing: false,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .join("\n")
    };
    let gap = super::monitor::Event::Gap {
        from_us: 10_004_000,
        to_us: 10_024_000,
    };
    assert_eq!(check_with(master(gap)), "");
    let lost = super::monitor::Event::Lost { at_us: 10_004_000 };
    let violations = check_with(master(lost));
    assert!(violations.contains("server-side tenure"), "{violations}");
}

#[test]
fn the_checks_report_the_models_findings_and_lock_keys_left_without_a_ttl() {
    let mut history = model::rebuild(&[], "lock:", false);
    history.violations = vec![
        "(d) PEXPIRE 5000 of live lock lock:register at 1".to_owned(),
        "(model) DEL of lock:register by h:2:b at 2 while h:1:a held it until 3 ms".to_owned(),
        "(f) PERSIST of lock key lock:register at 4".to_owned(),
    ];
    let histories = [history];
    let report = check(&Inputs {
        leftover_without_ttl: &["lock:register on port 1 (PTTL -1)".to_owned()],
        ..Inputs::synthetic(&[], &histories)
    });
    assert_eq!(
        report.violations,
        [
            "(d) PEXPIRE 5000 of live lock lock:register at 1",
            "(d) (model) DEL of lock:register by h:2:b at 2 while h:1:a held it until 3 ms",
            "(f) PERSIST of lock key lock:register at 4",
            "(f) lock key without TTL at the end: lock:register on port 1 (PTTL -1)",
        ]
    );
}

#[test]
fn a_section_killed_during_its_release_ends_where_its_body_was_over() {
    let lines = [
        // Over (and then released) before the kill, which came before the `end` record.
        Synthetic::new(1, "1.0", "h:1:a", 1, (100, 0)).begin(),
        Line {
            worker: 1,
            record: Record::Over {
                w: "1.0".into(),
                seq: 1,
                end: 200,
                lost_seen: false,
                lost_at: None,
            },
        },
        // Killed inside its body.
        Synthetic::new(2, "2.0", "h:2:b", 2, (300, 0)).begin(),
    ];
    let killed = HashMap::from([(1, 900), (2, 1000)]);
    let secs = sections(&lines, &killed);
    let ends: Vec<(u64, i64, Ending)> = secs.iter().map(|s| (s.fence, s.end, s.outcome)).collect();
    assert_eq!(ends, [(1, 200, Ending::Killed), (2, 1000, Ending::Killed)]);
}

#[test]
fn fences_follow_the_servers_order_of_tenures_also_when_a_token_was_granted_twice() {
    let acquire = |at: &str, token: &str| {
        [
            format!(
                r#"+{at}00 [0 127.0.0.1:1] "evalsha" "s" "2" "lock:register" "fence:{{lock:register}}" "{token}" "1000" "1""#
            ),
            format!(r#"+{at}10 [0 lua] "SET" "lock:register" "{token}" "NX" "PX" "1000""#),
            format!(r#"+{at}20 [0 lua] "INCR" "fence:{{lock:register}}""#),
        ]
    };
    // A's first grant (fence 1) lost its reply and expired; B got fence 2; A's retry with the
    // same token got fence 3. Only B's and A's second tenure have sections.
    let events = monitored(
        [
            acquire("10.0000", "h:1:a"),
            acquire("12.0000", "h:2:b"),
            acquire("14.0000", "h:1:a"),
        ]
        .iter()
        .flatten(),
    );
    let histories = [model::rebuild(&[events], "lock:", false)];
    let run = |fences: (u64, u64)| {
        let section = |worker, w, token, fence, during| Synthetic {
            write: StoreCall::NotMade,
            ..Synthetic::new(worker, w, token, fence, during)
        };
        let lines = [
            section(2, "2.0", "h:2:b", fences.0, (12_000_100, 12_000_200)).end(),
            section(1, "1.0", "h:1:a", fences.1, (14_000_100, 14_000_200)).end(),
        ];
        check(&Inputs::synthetic(&lines, &histories)).violations
    };
    assert_eq!(run((2, 3)), Vec::<String>::new());
    assert_eq!(run((3, 2)), ["(b) fencing token 2 was granted after 3"]);
}

#[test]
fn the_checks_judge_readers_writers_permits_and_multi_key_sections_per_key() {
    let section = |w, kind, keys: &'static [&'static str], token, during| {
        Synthetic {
            write: StoreCall::NotMade,
            kind,
            keys,
            ..Synthetic::new(1, w, token, 0, during)
        }
        .end()
    };
    let (read, write, permit, multi) = (
        LockKind::Read,
        LockKind::Write,
        LockKind::Permit,
        LockKind::Multi,
    );
    let lines = [
        // Readers side by side: fine. A writer beside one of them: not.
        section(
            "1.r",
            read,
            &["lock:rw"],
            "h:1:r1",
            (10_000_000, 10_400_000),
        ),
        section(
            "2.r",
            read,
            &["lock:rw"],
            "h:2:r2",
            (10_100_000, 10_300_000),
        ),
        section(
            "3.w",
            write,
            &["lock:rw"],
            "h:3:w1",
            (10_350_000, 10_500_000),
        ),
        // Three permits of two at once.
        section(
            "1.p",
            permit,
            &["lock:sem"],
            "h:1:p1",
            (11_000_000, 11_300_000),
        ),
        section(
            "2.p",
            permit,
            &["lock:sem"],
            "h:2:p2",
            (11_100_000, 11_400_000),
        ),
        section(
            "3.p",
            permit,
            &["lock:sem"],
            "h:3:p3",
            (11_200_000, 11_250_000),
        ),
        // Two multi-key locks sharing `lock:b`, and one on other keys beside them.
        section(
            "1.m",
            multi,
            &["lock:a", "lock:b"],
            "h:1:m1",
            (12_000_000, 12_300_000),
        ),
        section(
            "2.m",
            multi,
            &["lock:b", "lock:c"],
            "h:2:m2",
            (12_200_000, 12_400_000),
        ),
        section(
            "3.m",
            multi,
            &["lock:c", "lock:d"],
            "h:3:m3",
            (12_500_000, 12_600_000),
        ),
    ];
    let report = check(&Inputs::synthetic(&lines, &[History::default()]));
    let overlaps: Vec<&String> = report
        .violations
        .iter()
        .filter(|v| v.starts_with("(a) sections overlap") || v.contains("permits of"))
        .collect();
    let all = report.violations.join("\n");
    assert_eq!(overlaps.len(), 3, "{all}");
    assert!(all.contains("overlap on lock:rw: 1.r (read)"), "{all}");
    assert!(all.contains("and 3.w (write)"), "{all}");
    assert!(
        all.contains("3 permits of lock:sem held at once, of 2"),
        "{all}"
    );
    assert!(all.contains("overlap on lock:b: 1.m (multi)"), "{all}");
    // Every section is checked against its server-side tenure of each of its keys.
    assert!(all.contains("tenure of lock:a"), "{all}");
    assert!(all.contains("tenure of lock:d"), "{all}");
}

/// The `ready` records of workers, as (worker, pid).
#[cfg(test)]
fn ready<const N: usize>(workers: [(u32, u32); N]) -> [Line; N] {
    workers.map(|(worker, pid)| Line {
        worker,
        record: Record::Ready {
            w: worker.to_string(),
            pid,
        },
    })
}

/// A `kill -9` at 10 s of worker 1, holding the register's lock with token `h:11:a` and
/// `pttl_ms` of its lease left.
#[cfg(test)]
fn kill_9_of_the_holder_h_11_a_at_10_s(pttl_ms: i64) -> FaultRecord {
    FaultRecord {
        kind: "client-kill-9".into(),
        start_us: 10_000_000,
        end_us: 10_000_000,
        victim: Some(1),
        held: true,
        pttl_ms,
        victim_token: Some("h:11:a".into()),
        key: None,
    }
}

#[test]
fn a_lock_handed_to_a_stopped_or_dead_processs_waiter_is_not_a_hand_over() {
    let lines = ready([(1, 11), (2, 22), (3, 33)]);
    // The holder (worker 1) is killed at 10 s; at 10.9 s the lock goes to a waiter of worker 2,
    // which is stopped from 9.5 s to 13 s; worker 3 takes it at 12 s.
    let events = monitored([
        r#"+9.000000 [0 127.0.0.1:1] "SET" "lock:register" "h:11:a" "NX" "PX" "1900""#,
        r#"+10.900000 [0 127.0.0.1:1] "SET" "lock:register" "h:22:b" "NX" "PX" "1000""#,
        r#"+12.000000 [0 127.0.0.1:1] "SET" "lock:register" "h:33:c" "NX" "PX" "1000""#,
    ]);
    let histories = [model::rebuild(&[events], "lock:", false)];
    let faults = [
        kill_9_of_the_holder_h_11_a_at_10_s(900),
        FaultRecord {
            kind: "client-sigstop-waiter".into(),
            start_us: 9_500_000,
            end_us: 13_000_000,
            victim: Some(2),
            held: false,
            pttl_ms: 0,
            victim_token: None,
            key: None,
        },
    ];
    let killed: HashMap<u32, i64> = [(1, 10_000_000)].into();
    let report = check(&Inputs {
        faults: &faults,
        killed: &killed,
        ..Inputs::synthetic(&lines, &histories)
    });
    let all = report.violations.join("\n");
    assert!(
        all.contains("another owner took it 2000 ms later"),
        "the stopped waiter's tenure is no hand-over: {all}"
    );
}

/// (c) times a hand-over without the jump of the wall clock that came between the hit and the
/// next holder: the servers' clock jumped too, so the lease ran out no later for it.
#[test]
fn a_hand_over_across_a_jump_of_the_wall_clock_is_timed_without_the_jump() {
    let lines = ready([(1, 11), (2, 22)]);
    // The holder (worker 1) is killed at 10 s; the wall clock jumps 9 s forward 200 ms later,
    // and worker 2 takes the lock 600 ms after the kill by the monotonic clock.
    let events = monitored([
        r#"+9.500000 [0 127.0.0.1:1] "SET" "lock:register" "h:11:a" "NX" "PX" "1000""#,
        r#"+19.600000 [0 127.0.0.1:1] "SET" "lock:register" "h:22:b" "NX" "PX" "1000""#,
    ]);
    let histories = [model::rebuild(&[events], "lock:", false)];
    let faults = [kill_9_of_the_holder_h_11_a_at_10_s(500)];
    let killed: HashMap<u32, i64> = [(1, 10_000_000)].into();
    let hand_over = |steps: &[ClockStep]| {
        check(&Inputs {
            faults: &faults,
            killed: &killed,
            clock_steps: steps,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .join("\n")
    };
    assert!(
        hand_over(&[]).contains("another owner took it 9600 ms later"),
        "{}",
        hand_over(&[])
    );
    let jump = ClockStep {
        before_us: 10_200_000,
        after_us: 19_202_000,
        moved_us: 9_000_000,
    };
    assert_eq!(hand_over(&[jump]), "");
}

/// (c) excuses a hand-over late by no more than a server was seen running nothing meanwhile
/// (its pulses late: it, or the test process with the proxies, kept off the CPU), counting
/// only what of each stall lies between the lease's end and the hand-over, server by server;
/// never a worker's late heartbeat, which the library's own code can cause.
#[test]
fn a_hand_over_late_by_a_stall_of_the_servers_pulses_is_excused_and_only_by_it() {
    let faults = [kill_9_of_the_holder_h_11_a_at_10_s(900)];
    let killed: HashMap<u32, i64> = [(1, 10_000_000)].into();
    // The holder (worker 1) is killed at 10 s with 900 ms of lease left; worker 2 takes the
    // lock 1377 ms later, 77 ms past the bound. Two servers of one group run a pulse every
    // 10 ms from 9 s to 12 s, except over their `silent` stretches (from, to, in ms); the
    // first one also runs the lock's commands. `heartbeat` is a worker's heartbeat that ran
    // late (worker, when it ran and by how much, in ms).
    let judged_with = |silent: [(i64, i64); 2], heartbeat: Option<(u32, i64, u64)>| {
        let mut lines = ready([(1, 11), (2, 22)]).to_vec();
        lines.extend(heartbeat.map(|(worker, at, late)| Line {
            worker,
            record: Record::Stall {
                w: worker.to_string(),
                at: at * 1000,
                late_us: late * 1000,
            },
        }));
        let streams: Vec<_> = silent
            .iter()
            .enumerate()
            .map(|(server, silent)| {
                let mut stream: Vec<(i64, String)> = (900..1200)
                    .map(|tick| tick * 10)
                    .filter(|ms| *ms <= silent.0 || *ms >= silent.1)
                    .map(|ms| (ms, r#""ECHO" "pulse""#.to_owned()))
                    .collect();
                if server == 0 {
                    stream.push((
                        9_100,
                        r#""SET" "lock:register" "h:11:a" "NX" "PX" "1000""#.into(),
                    ));
                    stream.push((
                        11_377,
                        r#""SET" "lock:register" "h:22:b" "NX" "PX" "1000""#.into(),
                    ));
                }
                stream.sort_by_key(|(ms, _)| *ms);
                monitored(stream.iter().map(|(ms, command)| {
                    format!(
                        "+{}.{:03}000 [0 127.0.0.1:9] {command}",
                        ms / 1000,
                        ms % 1000
                    )
                }))
            })
            .collect();
        let histories = [model::rebuild(&streams, "lock:", false)];
        check(&Inputs {
            faults: &faults,
            killed: &killed,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .join("\n")
    };
    let judged = |first, second| judged_with([first, second], None);
    let late = "another owner took it 1377 ms later";
    let none = (0, 0);
    let on_time = judged(none, none);
    assert!(on_time.contains(late), "{on_time}");
    assert!(
        on_time.contains("and 0 ms seen kept off the CPU"),
        "{on_time}"
    );
    // 425 ms without a pulse, 125 ms of it after the lease's end: excused.
    assert_eq!(judged((10_600, 11_025), none), "");
    assert_eq!(judged(none, (10_600, 11_025)), "");
    // The same stall, but over the lease: nobody could take the lock then.
    let leased = judged((10_400, 10_900), none);
    assert!(leased.contains(late), "{leased}");
    assert!(
        leased.contains("and 0 ms seen kept off the CPU"),
        "{leased}"
    );
    // After the lease's end but shorter than the lateness, on each server: the servers'
    // stalls are not added up.
    let each_short = judged((10_940, 10_990), (11_040, 11_090));
    assert!(each_short.contains(late), "{each_short}");
    assert!(
        each_short.contains("and 40 ms seen kept off the CPU"),
        "{each_short}"
    );
    // The taker's runtime 200 ms late: not excused, since a blocking library makes that too.
    let heartbeat = judged_with([none, none], Some((2, 11_200, 200)));
    assert!(heartbeat.contains(late), "{heartbeat}");
}

/// (c) over the election's key: after its leader was killed in a term, the next term is
/// judged like the register's next holder, and counted as a new term.
#[test]
fn a_new_term_after_a_leaders_crash_is_judged_on_the_elections_key() {
    let lines = ready([(1, 11), (2, 22)]);
    // Worker 1 leads from 9 s and is killed at 10 s; the register changes hands meanwhile.
    let history = |next_term: Option<&str>| {
        let events = monitored(
            [
                r#"+9.000000 [0 127.0.0.1:1] "SET" "lock:leader" "1.l@h:11:a" "NX" "PX" "1900""#
                    .to_owned(),
                r#"+10.100000 [0 127.0.0.1:1] "SET" "lock:register" "h:22:r" "NX" "PX" "1000""#
                    .to_owned(),
            ]
            .into_iter()
            .chain(next_term.map(|at| {
                format!(
                    r#"+{at} [0 127.0.0.1:1] "SET" "lock:leader" "2.l@h:22:b" "NX" "PX" "1000""#
                )
            })),
        );
        [model::rebuild(&[events], "lock:", false)]
    };
    let term = Synthetic {
        kind: LockKind::Leader,
        keys: &["lock:leader"],
        write: StoreCall::NotMade,
        ..Synthetic::new(1, "1.l", "1.l@h:11:a", 0, (9_000_100, 9_500_000))
    };
    let lines: Vec<Line> = lines
        .into_iter()
        .chain([term.begin(), term.end()])
        .collect();
    let faults = [FaultRecord {
        kind: "client-kill-9-leader".into(),
        start_us: 10_000_000,
        end_us: 10_000_000,
        victim: Some(1),
        held: true,
        pttl_ms: 900,
        victim_token: Some("1.l@h:11:a".into()),
        key: Some("lock:leader".into()),
    }];
    let killed: HashMap<u32, i64> = [(1, 10_000_000)].into();
    let check_with = |next_term: Option<&str>| {
        let histories = history(next_term);
        let report = check(&Inputs {
            fencing: false,
            faults: &faults,
            killed: &killed,
            minimums: Minimums {
                new_terms: 1,
                ..Minimums::NONE
            },
            ..Inputs::synthetic(&lines, &histories)
        });
        (report.violations.join("\n"), report.lines.join("\n"))
    };
    // The next term 0.95 s after the crash: judged, and counted.
    let (violations, lines) = check_with(Some("10.950000"));
    assert_eq!(violations, "");
    assert!(
        lines.contains("(1 of them new terms after a leader's crash)"),
        "{lines}"
    );
    // 2 s after it: too late, though the register changed hands at once.
    let (violations, _) = check_with(Some("12.000000"));
    assert!(
        violations.contains("(c) after client-kill-9-leader of the holder of lock:leader at 10000000 (its lease had 900 ms left), another owner took it 2000 ms later"),
        "{violations}"
    );
    // No next term at all: a violation, and a run that showed none.
    let (violations, _) = check_with(None);
    assert!(
        violations.contains("(c) nobody held lock:leader again after client-kill-9-leader"),
        "{violations}"
    );
    assert!(
        violations
            .contains("(run) the run exercised too little: 0 new terms after a leader's crash"),
        "{violations}"
    );
}

/// (e) of a body cancelled 1 ms after its key expired (the fixture of
/// `a_late_cancel_is_excused_only_by_a_stall_that_covers_it`): its own process stopped is an
/// excuse only if the stop overlaps the span from when the library's timer was due (12 ms
/// before the expiry) to the body's end.
#[test]
fn a_late_cancel_is_excused_only_by_a_pause_over_its_due_time() {
    let (cancelled, histories) = late_cancel();
    let lines = [cancelled.begin(), cancelled.end()];
    let check_with = |stopped: (i64, i64)| {
        let faults = [FaultRecord {
            kind: "client-sigstop".into(),
            start_us: stopped.0,
            end_us: stopped.1,
            victim: Some(1),
            held: false,
            pttl_ms: 0,
            victim_token: None,
            key: None,
        }];
        let report = check(&Inputs {
            register: 0,
            faults: &faults,
            ..Inputs::synthetic(&lines, &histories)
        });
        (report.violations.join("\n"), report.lines.join("\n"))
    };
    // Stopped from just before the timer was due until just before the body ended: excused.
    let (violations, lines) = check_with((10_985_000, 11_001_500));
    assert_eq!(violations, "");
    assert!(
        lines.contains("limits seen: 1 bodies of stopped processes"),
        "{lines}"
    );
    // Stopped, and over long before the timer was due: the timer was free to run.
    let (violations, _) = check_with((10_200_000, 10_300_000));
    assert!(
        violations.contains(
            "(e) 1.0 fence 1 (lost-expired) stopped at 11002000, 1000 µs after its key expired"
        ),
        "{violations}"
    );
}

/// A double grant: A's lock is deleted under it at 10.4 s (a force-unlock) and B takes it at
/// 10.5 s while A's body runs on; A learns of its loss at `lost_at` and stops 50 ms later.
/// Every section is judged from the servers' histories up to the moment its loss was seen, and
/// (e) judges a cancelled body by its tenure's end, not only its key's expiry.
#[test]
fn a_section_reported_lost_is_judged_until_its_loss_was_seen() {
    let histories = [model::rebuild(
        &[monitored([
            r#"+10.000000 [0 127.0.0.1:1] "SET" "lock:register" "h:1:a" "NX" "PX" "1000""#,
            r#"+10.400000 [0 127.0.0.1:3] "DEL" "lock:register""#,
            r#"+10.500000 [0 127.0.0.1:2] "SET" "lock:register" "h:2:b" "NX" "PX" "1000""#,
        ])],
        "lock:",
        false,
    )];
    let b = Synthetic {
        write: StoreCall::NotMade,
        ..Synthetic::new(2, "2.0", "h:2:b", 2, (10_500_100, 10_600_000))
    };
    // Task `w` of worker 1 (`.0` cancels its body on loss, `.1` goes on), ending as `outcome`.
    let a = |w, outcome, lost_seen, lost_at: i64| Synthetic {
        outcome,
        lost_seen,
        lost_at: Some(lost_at),
        write: StoreCall::NotMade,
        ..Synthetic::new(1, w, "h:1:a", 1, (10_000_100, lost_at + 50_000))
    };
    let cancelled = Outcome::Lost(lock_runtime::LostReason::Stolen);
    let check_with = |a: Synthetic, faults: &[FaultRecord]| {
        let lines = [a.begin(), a.end(), b.begin(), b.end()];
        check(&Inputs {
            register: 0,
            faults,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .join("\n")
    };
    // Seen at 10.8 s: A held nothing from 10.4 s, and B held the lock beside it.
    let v = check_with(a("1.0", cancelled, false, 10_800_000), &[]);
    for expected in [
        "(a) sections overlap on lock:register: 1.0 (lock) fence 1 [10000100, 10800000] (lost-stolen) and 2.0",
        "(a) 1.0 (lock) fence 1 [10000100, 10800000] (lost-stolen, ended 10850000) ran outside its server-side tenure",
        "(e) 1.0 fence 1 (lost-stolen) stopped at 10850000, 450000 µs after its tenure ended (deleted by a client)",
    ] {
        assert!(v.contains(expected), "missing {expected:?} in:\n{v}");
    }
    // The same of a body that went on (`on_lost = continue`) and returned Ok having seen it.
    let v = check_with(a("1.1", Outcome::Ok, true, 10_800_000), &[]);
    assert!(
        v.contains("(a) sections overlap on lock:register: 1.1"),
        "{v}"
    );
    // Seen at 10.39 s, stopped at 10.44 s: nothing held beside it while it trusted its lease.
    assert_eq!(check_with(a("1.1", Outcome::Ok, true, 10_390_000), &[]), "");
    // Seen at 10.8 s by a process stopped from 10.35 s: judged until it stopped.
    let stopped = [FaultRecord {
        kind: "client-sigstop".into(),
        start_us: 10_350_000,
        end_us: 10_790_000,
        victim: Some(1),
        held: false,
        pttl_ms: 600,
        victim_token: None,
        key: None,
    }];
    assert_eq!(
        check_with(a("1.1", Outcome::Ok, true, 10_800_000), &stopped),
        ""
    );
}

/// (c) does not judge a hit of a holder that another fault followed within ttl + bound, and the
/// summary says how many it left so.
#[test]
fn hits_of_a_holder_that_another_fault_followed_are_counted_as_unjudged() {
    let lines = ready([(1, 11), (2, 22)]);
    let histories = [model::rebuild(
        &[monitored([
            r#"+9.000000 [0 127.0.0.1:1] "SET" "lock:register" "h:11:a" "NX" "PX" "1900""#,
            r#"+10.950000 [0 127.0.0.1:1] "SET" "lock:register" "h:22:b" "NX" "PX" "1000""#,
        ])],
        "lock:",
        false,
    )];
    let kill = || kill_9_of_the_holder_h_11_a_at_10_s(900);
    let killed: HashMap<u32, i64> = [(1, 10_000_000)].into();
    let summary = |next_fault_at: i64| {
        let faults = [
            kill(),
            FaultRecord {
                kind: "blackhole".into(),
                start_us: next_fault_at,
                end_us: next_fault_at + 500_000,
                victim: None,
                held: false,
                pttl_ms: 0,
                victim_token: None,
                key: None,
            },
        ];
        let report = check(&Inputs {
            faults: &faults,
            killed: &killed,
            ..Inputs::synthetic(&lines, &histories)
        });
        assert_eq!(report.violations.join("\n"), "");
        report.lines.join("\n")
    };
    let judged = summary(12_000_000);
    assert!(
        judged.contains("slowest of 1 hand-overs")
            && judged.contains("; 0 hits of a holder not judged"),
        "{judged}"
    );
    let overlapped = summary(10_500_000);
    assert!(
        overlapped.contains("slowest of 0 hand-overs")
            && overlapped.contains("; 1 hits of a holder not judged"),
        "{overlapped}"
    );
}

/// (b) without fencing: a write that goes back to an older value is excused only as the late
/// write of a process stopped during its register section, whose worker never saw that write
/// answered (the limit fencing exists for), once per such section; with fencing, or without
/// such a stop, it is a lost increment.
#[test]
fn without_fencing_only_a_stopped_writers_late_write_may_go_back() {
    let late = Synthetic {
        write: StoreCall::InFlight,
        outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
        ..Synthetic::new(1, "1.0", "h:1:a", 0, (10_000_000, 11_500_000))
    };
    let lines = [late.begin(), late.end()];
    let stop = FaultRecord {
        kind: "client-sigstop-waiter".into(),
        start_us: 10_100_000,
        end_us: 11_400_000,
        victim: Some(1),
        held: false,
        pttl_ms: 0,
        victim_token: None,
        key: None,
    };
    // Read 1, stopped, written after two more holders: 2 again.
    let log = ["0:1", "0:2", "0:3", "0:2", "0:3"].map(String::from);
    let (_, histories) = late_cancel();
    let judged = |faults: &[FaultRecord], fencing: bool, register: i64| {
        check(&Inputs {
            fencing,
            faults,
            register,
            log: &log,
            ..Inputs::synthetic(&lines, &histories)
        })
        .violations
        .into_iter()
        .filter(|v| v.starts_with("(b) accepted") || v.starts_with("(b) register"))
        .collect::<Vec<_>>()
    };
    assert_eq!(
        judged(std::slice::from_ref(&stop), false, 3),
        Vec::<String>::new()
    );
    let flagged = judged(&[], false, 3).join("\n");
    assert!(
        flagged.contains("accepted write #4 wrote 2 after 3"),
        "{flagged}"
    );
    let flagged = judged(std::slice::from_ref(&stop), true, 3).join("\n");
    assert!(
        flagged.contains("accepted write #4 wrote 2 after 3"),
        "{flagged}"
    );
    // The register holds the last value written, whatever was excused.
    let flagged = judged(&[stop], false, 5).join("\n");
    assert!(
        flagged.contains("register 5 != 5 accepted increments (last written 3"),
        "{flagged}"
    );
}
