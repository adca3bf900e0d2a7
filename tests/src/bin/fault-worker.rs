//! A lock client process for the fault-injection suite (`tests/tests/faults`).
//!
//! `fault-worker workload --lock-url U --store-url S --key K --ttl-ms T --id N [..]` loops over
//! a lock-protected read-modify-write of a register held in a *fenced store* (a Lua script on a
//! second, unfaulted redis-server at `S`: an operation carrying a fencing token lower than the
//! highest it has seen is rejected). Everything it prints is a [`Record`], one JSON line each
//! (`lock_tests::records` says what each means): a `begin` record when a critical section
//! starts, `over` the moment its body is over (before the lock is released), and `end` once
//! the acquisition returned, so the test can check the invariants across processes; besides
//! those `ready`, `err` (a failed acquisition), `drop` (how long dropping a guard or a guarded
//! future took), `stall` (the runtime did not run a 10 ms heartbeat on time) and `done`. The
//! loop stops when stdin closes.
//!
//! `fault-worker victim ..` takes the lock once, reads the register, stops itself with SIGSTOP
//! in the middle of the critical section (the worst-timed process pause), and after SIGCONT
//! writes (or returns at once with `--after-pause return`); it prints what happened (`pausing`,
//! `resumed`, `wrote`, `outcome`, `exit`).
//!
//! `fault-worker tokens --count N` prints N lock tokens (`token` records, for the randomness
//! checks).

use std::collections::HashMap;
use std::future::Future;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use lock_runtime::{LockError, Mode, OnLost, Registry};
use lock_tests::records::{Dropped, LockKind, Outcome, Record, StoreCall};
use redis::aio::MultiplexedConnection;

/// Wall-clock microseconds, comparable across processes and with Redis' MONITOR timestamps.
fn now_us() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(d.as_micros()).expect("fits in i64")
}

/// The fenced store: `KEYS` max fence seen, register, log of accepted writes, count of rejected
/// operations; `ARGV` fence, `read`|`write`, value.
/// Reads are fenced too, so a read-modify-write by a stale holder cannot slip between a newer
/// holder's read and write.
const FENCED_LUA: &str = r"
local fence = tonumber(ARGV[1])
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < max then
  redis.call('INCR', KEYS[4])
  return {0, max}
end
if fence > max then redis.call('SET', KEYS[1], ARGV[1]) end
if ARGV[2] == 'read' then return {1, tonumber(redis.call('GET', KEYS[2]) or '0')} end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('RPUSH', KEYS[3], ARGV[1] .. ':' .. ARGV[3])
return {1, tonumber(ARGV[3])}
";

struct Args(HashMap<String, String>);

impl Args {
    fn parse(args: impl Iterator<Item = String>) -> Self {
        let mut map = HashMap::new();
        let mut args = args.peekable();
        while let Some(name) = args.next() {
            let name = name
                .strip_prefix("--")
                .unwrap_or_else(|| panic!("expected --name value, got {name}"))
                .to_owned();
            let value = args
                .next()
                .unwrap_or_else(|| panic!("--{name} needs a value"));
            map.insert(name, value);
        }
        Self(map)
    }

    fn str(&self, name: &str) -> String {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("missing --{name}"))
            .clone()
    }

    fn num(&self, name: &str, default: u64) -> u64 {
        self.0.get(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--{name} wants a number"))
        })
    }

    fn ms(&self, name: &str, default: u64) -> Duration {
        Duration::from_millis(self.num(name, default))
    }
}

/// The lock backend under test (`--backend`), one arm per mode of the suite's `LockSystem`;
/// the workload and the checks are the same for all. `--lock-url` is a comma-separated list
/// for Redlock's masters, a cluster's seeds and the sentinels (for Postgres, a connection string); `--confirm-replicas N` is
/// `RegistryBuilder::confirm_replicas` (0, the default: none).
fn registry(args: &Args) -> Registry {
    let confirm = u32::try_from(args.num("confirm-replicas", 0)).expect("a replica count");
    let builder = Registry::builder()
        .connect_timeout(args.ms("connect-ms", 500))
        .command_timeout(args.ms("command-ms", 500))
        .confirm_replicas(confirm);
    let urls = args.str("lock-url");
    let list = urls.split(',');
    let backend = args.0.get("backend").map_or("single", String::as_str);
    let builder = match backend {
        "single" => builder.url(urls.clone()),
        "redlock" => builder.redlock(list),
        "cluster" => builder.cluster(list),
        "sentinel" => builder.sentinel(args.str("master"), list),
        "postgres" => builder.postgres(urls.clone()),
        other => panic!(
            "unknown --backend {other}; this worker knows: single, redlock, cluster, sentinel, \
             postgres"
        ),
    };
    builder.build().expect("registry")
}

#[derive(Clone)]
struct Store {
    con: MultiplexedConnection,
    script: redis::Script,
    keys: [String; 4],
}

impl Store {
    async fn connect(url: &str, key: &str) -> Self {
        let client = redis::Client::open(url).expect("store url");
        let con = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the fenced store");
        Self {
            con,
            script: redis::Script::new(FENCED_LUA),
            keys: [
                format!("store:{key}:max"),
                format!("store:{key}:register"),
                format!("store:{key}:log"),
                format!("store:{key}:rejected"),
            ],
        }
    }

    /// `Some(value)` if the store accepted the operation, `None` if it rejected a stale fence.
    async fn call(&self, fence: u64, op: &str, value: i64) -> redis::RedisResult<Option<i64>> {
        let mut con = self.con.clone();
        let (accepted, value): (i64, i64) = self
            .script
            .key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .key(&self.keys[3])
            .arg(fence)
            .arg(op)
            .arg(value)
            .invoke_async(&mut con)
            .await?;
        Ok((accepted == 1).then_some(value))
    }

    /// Unfenced: what a store without fencing would do.
    async fn plain_read(&self) -> redis::RedisResult<i64> {
        let mut con = self.con.clone();
        let v: Option<i64> = redis::cmd("GET")
            .arg(&self.keys[1])
            .query_async(&mut con)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Unfenced: sets the register and logs the write, as a store without fencing would.
    async fn plain_write(&self, value: i64) -> redis::RedisResult<()> {
        let mut con = self.con.clone();
        redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&self.keys[1])
            .arg(value)
            .ignore()
            .cmd("RPUSH")
            .arg(&self.keys[2])
            .arg(format!("plain:{value}"))
            .ignore()
            .query_async(&mut con)
            .await
    }
}

/// What a body knows of its call to the fenced store, once the store answered (or failed to).
fn store_call(answer: &redis::RedisResult<Option<i64>>) -> StoreCall {
    match answer {
        Ok(Some(_)) => StoreCall::Accepted,
        Ok(None) => StoreCall::Rejected,
        Err(_) => StoreCall::Failed,
    }
}

/// One critical section as the worker saw it.
struct Section {
    token: String,
    fence: u64,
    /// When the acquisition began.
    called: i64,
    /// When the body began; 0 until it does.
    start: i64,
    end: Option<i64>,
    stopped: Option<i64>,
    lost_seen: bool,
    /// When the lease was seen lost (see `watch_loss`).
    lost_at: Option<i64>,
    read: StoreCall,
    write: StoreCall,
    /// What is locked: the kind of lock, and its Redis keys.
    kind: LockKind,
    keys: Vec<String>,
}

type Shared = Arc<Mutex<Section>>;

/// A section of `kind` on the Redis keys `keys`, about to be called.
fn shared(kind: LockKind, keys: Vec<String>) -> Shared {
    Arc::new(Mutex::new(Section {
        token: String::new(),
        fence: 0,
        called: now_us(),
        start: 0,
        end: None,
        stopped: None,
        lost_seen: false,
        lost_at: None,
        read: StoreCall::NotMade,
        write: StoreCall::NotMade,
        kind,
        keys,
    }))
}

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Section> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records when the body future was dropped before it finished.
struct StopStamp(Shared);

impl Drop for StopStamp {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        if s.end.is_none() {
            s.stopped = Some(now_us());
        }
    }
}

/// Writes `record` as one line on stdout.
fn out(record: &Record) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    // A closed pipe means the test is gone: stop quietly.
    if writeln!(stdout, "{}", record.line()).is_err() {
        std::process::exit(0);
    }
}

fn begin(w: &str, seq: u64, s: &Shared, token: &str, fence: u64, hold: Duration) {
    let start = now_us();
    let record = {
        let mut g = lock(s);
        g.token = token.to_owned();
        g.fence = fence;
        g.start = start;
        Record::Begin {
            w: w.to_owned(),
            seq,
            token: token.to_owned(),
            fence,
            called: g.called,
            start,
            kind: g.kind,
            keys: g.keys.clone(),
            hold_ms: millis(hold),
        }
    };
    out(&record);
}

/// The body is over (its last instruction ran, or it is about to be dropped): recorded and
/// printed *before* the lock is released, so a kill between the release and the `end` record
/// still leaves the section's true end on record.
fn body_over(w: &str, seq: u64, s: &Shared, end: i64, lost_seen: bool) {
    let lost_at = {
        let mut g = lock(s);
        g.end = Some(end);
        g.lost_seen = lost_seen;
        seen_lost(&mut g, lost_seen)
    };
    out(&Record::Over {
        w: w.to_owned(),
        seq,
        end,
        lost_seen,
        lost_at,
    });
}

/// Stamps the moment the lease of `s` is seen lost: the checker judges the section from the
/// servers' histories up to there. A release (the section's own end) is no loss.
fn watch_loss(s: &Shared, current: lock_runtime::CurrentLock) {
    let s = s.clone();
    tokio::spawn(async move {
        if let LockError::Lost { reason, .. } = current.lost().await {
            if reason != lock_runtime::LostReason::Released {
                note_loss(&s);
            }
        }
    });
}

fn note_loss(s: &Shared) {
    lock(s).lost_at.get_or_insert_with(now_us);
}

/// `lost_at`, or now where the loss is known (`lost`) and the watcher has not run yet: the
/// loss was seen by now at the latest.
fn seen_lost(g: &mut Section, lost: bool) -> Option<i64> {
    if lost {
        g.lost_at.get_or_insert_with(now_us);
    }
    g.lost_at
}

/// Drops `held` (a guard or a guarded future) and records how long the drop took, then the
/// section's end.
fn drop_timed<T>(w: &str, seq: u64, s: &Shared, dropped: Dropped, held: T) {
    let at = std::time::Instant::now();
    drop(held);
    let took = at.elapsed();
    out(&Record::Drop {
        w: w.to_owned(),
        at: now_us(),
        dropped,
        took_us: micros(took),
    });
    end_record(w, seq, s, Outcome::Dropped);
}

fn end_record(w: &str, seq: u64, s: &Shared, outcome: Outcome) {
    let record = {
        let mut g = lock(s);
        let lost = g.lost_seen || matches!(outcome, Outcome::Lost(_));
        let lost_at = seen_lost(&mut g, lost);
        Record::End {
            w: w.to_owned(),
            seq,
            token: g.token.clone(),
            fence: g.fence,
            start: g.start,
            end: g.end.or(g.stopped).unwrap_or_else(now_us),
            outcome,
            lost_seen: g.lost_seen,
            lost_at,
            read: g.read,
            write: g.write,
            kind: g.kind,
            keys: g.keys.clone(),
        }
    };
    out(&record);
}

/// An acquisition of section `seq` of task `w` failed before its body began.
fn err_record(w: &str, seq: u64, e: &LockError) {
    out(&Record::Err {
        w: w.to_owned(),
        seq,
        at: now_us(),
        outcome: Outcome::from(e),
        msg: e.to_string(),
    });
}

/// Prints how section `seq` of task `w` ended: its `end` record, or `err` if it never began.
fn finish(w: &str, seq: u64, s: &Shared, outcome: &Result<(), LockError>) {
    let started = lock(s).start != 0;
    match (outcome, started) {
        (Ok(()), _) => end_record(w, seq, s, Outcome::Ok),
        (Err(e), true) => end_record(w, seq, s, Outcome::from(e)),
        (Err(e), false) => err_record(w, seq, e),
    }
}

/// `d` in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("fits in u64")
}

/// `d` in whole microseconds.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits in u64")
}

/// The lock kinds besides the register's exclusive lock, each looped on by a task of its own.
#[derive(Clone, Copy)]
enum Kind {
    /// A reader of the read-write lock.
    Read,
    /// A writer of the read-write lock.
    Write,
    /// One of the semaphore's permits.
    Permit,
    /// Two of three keys, together.
    Multi,
    /// A term of the election's leader.
    Leader,
}

impl Kind {
    const ALL: [Self; 5] = [
        Self::Read,
        Self::Write,
        Self::Permit,
        Self::Multi,
        Self::Leader,
    ];

    /// What the records call it.
    fn lock_kind(self) -> LockKind {
        match self {
            Self::Read => LockKind::Read,
            Self::Write => LockKind::Write,
            Self::Permit => LockKind::Permit,
            Self::Multi => LockKind::Multi,
            Self::Leader => LockKind::Leader,
        }
    }

    /// The task's name suffix (`<worker>.<suffix>`).
    fn task(self) -> char {
        match self {
            Self::Read => 'r',
            Self::Write => 'w',
            Self::Permit => 'p',
            Self::Multi => 'm',
            Self::Leader => 'l',
        }
    }
}

/// The keys of the other kinds (`--rw-key`, `--sem-key` with `--permits`, `--multi-keys` a,b,c,
/// `--leader-key`).
struct Kinds {
    rw: String,
    /// The election's key: each section is one term.
    leader: String,
    sem: String,
    permits: u32,
    multi: [String; 3],
    /// Between two sections of a kind's task (`--kind-pause-ms`).
    pause: Duration,
    /// Between two sections of the writer's (`--write-pause-ms`, else `pause`).
    write_pause: Duration,
    /// Between two sections of the reader's (`--read-pause-ms`, else `pause`).
    read_pause: Duration,
}

impl Kinds {
    fn from(args: &Args) -> Option<Self> {
        let rw = args.0.get("rw-key")?.clone();
        let multi: Vec<String> = args
            .str("multi-keys")
            .split(',')
            .map(str::to_owned)
            .collect();
        Some(Self {
            rw,
            leader: args.str("leader-key"),
            sem: args.str("sem-key"),
            permits: u32::try_from(args.num("permits", 2)).expect("a few permits"),
            multi: multi.try_into().expect("--multi-keys names three keys"),
            pause: args.ms("kind-pause-ms", 0),
            write_pause: args.ms("write-pause-ms", args.num("kind-pause-ms", 0)),
            read_pause: args.ms("read-pause-ms", args.num("kind-pause-ms", 0)),
        })
    }
}

fn rand_below(n: u64) -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    // A cheap xorshift, seeded from the pid and clock; only for hold times.
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = (u64::from(std::process::id()) << 32) ^ now_us().unsigned_abs() | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x % n.max(1)
}

struct Workload {
    registry: Registry,
    store: Store,
    key: String,
    ttl: Duration,
    wait: Duration,
    hold_max_ms: u64,
    long_pct: u64,
    drop_every: u64,
    /// Whether locks carry fencing tokens (not in Redlock mode): without them the store is
    /// handed fence 0 and accepts everything, and a body writes only while its lease holds.
    fencing: bool,
    stop: Arc<AtomicBool>,
    /// Per task (the register's two, then the leader's): a hold (ms) the test asked the next
    /// section to use.
    long_requests: Arc<[AtomicU64; 3]>,
}

impl Workload {
    /// The guarded body: fenced read, a pause of a few ms, fenced write of read + 1.
    fn body(
        &self,
        w: String,
        seq: u64,
        s: Shared,
        forced: Option<(usize, u64)>,
    ) -> impl Future<Output = Result<(), LockError>> + 'static {
        let store = self.store.clone();
        let requests = self.long_requests.clone();
        let fencing = self.fencing;
        // Most sections are short; a few outlast the lease, so renewal happens while a body
        // runs. The test asks for a long one (`long <ms> <task>` on stdin) before a fault that
        // must catch a body in the middle.
        let usual = if rand_below(100) < self.long_pct {
            self.ttl * u32::try_from(30 + rand_below(121)).expect("small") / 100
        } else {
            Duration::from_millis(rand_below(self.hold_max_ms + 1))
        };
        async move {
            let current = lock_runtime::current().expect("inside a guarded body");
            let fence = current.fence().unwrap_or(0);
            let hold = forced.map_or(usual, |(task, ms)| take_request(&requests[task], ms, usual));
            begin(&w, seq, &s, current.token(), fence, hold);
            watch_loss(&s, current.clone());
            let _stamp = StopStamp(s.clone());
            let read = store.call(fence, "read", 0).await;
            lock(&s).read = store_call(&read);
            tokio::time::sleep(hold).await;
            // Without fencing, a write after a reported loss would be a lost update that no
            // lock can prevent: a careful body checks first.
            let may_write = fencing || !current.is_lost();
            if let (Ok(Some(value)), true) = (read, may_write) {
                lock(&s).write = StoreCall::InFlight;
                let written = store.call(fence, "write", value + 1).await;
                lock(&s).write = store_call(&written);
            }
            body_over(&w, seq, &s, now_us(), current.is_lost());
            Ok(())
        }
    }

    async fn section(&self, w: &str, seq: u64, on_lost: OnLost, forced: Option<(usize, u64)>) {
        let s = self.register_section();
        let outcome = self
            .registry
            .lock(self.key.clone())
            .ttl(self.ttl)
            .wait(self.wait)
            .fencing(self.fencing)
            .on_lost(on_lost)
            .run(self.body(w.to_owned(), seq, s.clone(), forced))
            .await;
        finish(w, seq, &s, &outcome);
    }

    /// A section of the register's lock, about to be called.
    fn register_section(&self) -> Shared {
        shared(LockKind::Lock, vec![format!("lock:{}", self.key)])
    }

    /// One section of another lock kind: a short body (now and then one that outlasts the
    /// lease, so that places are renewed), cancelled on loss.
    async fn kind_section(&self, kinds: &Kinds, kind: Kind, w: &str, seq: u64) {
        let (request, keys) = match kind {
            // A term is not a lock request: see `term_section`.
            Kind::Leader => (None, vec![kinds.leader.clone()]),
            Kind::Read => (
                Some(self.registry.lock(kinds.rw.clone()).mode(Mode::Read)),
                vec![kinds.rw.clone()],
            ),
            Kind::Write => (
                Some(self.registry.lock(kinds.rw.clone())),
                vec![kinds.rw.clone()],
            ),
            Kind::Permit => (
                Some(self.registry.lock(kinds.sem.clone()).permits(kinds.permits)),
                vec![kinds.sem.clone()],
            ),
            Kind::Multi => {
                // Two of the three keys: every pair overlaps every other in one key.
                let first = rand_below(3);
                let second = (first + 1 + rand_below(2)) % 3;
                let keys: Vec<String> = [first, second]
                    .iter()
                    .map(|&i| kinds.multi[usize::try_from(i).expect("small")].clone())
                    .collect();
                (Some(self.registry.lock_all(keys.clone())), keys)
            }
        };
        let redis_keys: Vec<String> = keys.iter().map(|k| format!("lock:{k}")).collect();
        let s = shared(kind.lock_kind(), redis_keys);
        let hold = if rand_below(40) == 0 {
            self.ttl * 3 / 2
        } else {
            Duration::from_millis(rand_below(self.hold_max_ms + 1))
        };
        let body = {
            let (s, w) = (s.clone(), w.to_owned());
            let requests = self.long_requests.clone();
            async move {
                let current = lock_runtime::current().expect("inside a guarded body");
                let hold = match kind {
                    Kind::Leader => {
                        let asked = requests[LEADER_SLOT].load(Ordering::SeqCst);
                        take_request(&requests[LEADER_SLOT], asked, hold)
                    }
                    _ => hold,
                };
                begin(&w, seq, &s, current.token(), 0, hold);
                watch_loss(&s, current.clone());
                let _stamp = StopStamp(s.clone());
                tokio::time::sleep(hold).await;
                body_over(&w, seq, &s, now_us(), current.is_lost());
                Ok::<_, LockError>(())
            }
        };
        let outcome = match request {
            Some(request) => request.ttl(self.ttl).wait(self.wait).run(body).await,
            None => {
                let election = self.registry.election(kinds.leader.clone());
                let campaign = election.identity(w).ttl(self.ttl).campaign();
                // A campaign waits as long as it takes; the workload's sections wait `wait`.
                match tokio::time::timeout(self.wait, campaign).await {
                    Ok(Ok(term)) => term.run(body).await,
                    Ok(Err(e)) => Err(e),
                    Err(_) => {
                        out(&Record::Err {
                            w: w.to_owned(),
                            seq,
                            at: now_us(),
                            outcome: Outcome::Busy,
                            msg: format!("not elected within {:?}", self.wait),
                        });
                        return;
                    }
                }
            }
        };
        finish(w, seq, &s, &outcome);
    }

    async fn kind_task(&self, kinds: &Kinds, kind: Kind, w: String) -> u64 {
        let mut seq = 0;
        while !self.stop.load(Ordering::SeqCst) {
            seq += 1;
            self.kind_section(kinds, kind, &w, seq).await;
            let pause = match kind {
                Kind::Write => kinds.write_pause,
                Kind::Read => kinds.read_pause,
                _ => kinds.pause,
            };
            tokio::time::sleep(pause).await;
        }
        seq
    }

    /// Cancellation: a guarded future dropped mid-body, or a guard dropped without release.
    /// Either must return at once, whatever the network does.
    async fn drop_test(&self, w: &str, seq: u64) {
        let s = self.register_section();
        if seq.is_multiple_of(2) {
            let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
            let store = self.store.clone();
            let body_state = s.clone();
            let held = Arc::new(Mutex::new(None::<lock_runtime::CurrentLock>));
            let body_held = held.clone();
            let w2 = w.to_owned();
            let mut run = Box::pin(
                self.registry
                    .lock(self.key.clone())
                    .ttl(self.ttl)
                    .wait(self.wait)
                    .fencing(self.fencing)
                    .run(async move {
                        let current = lock_runtime::current().expect("inside a guarded body");
                        let fence = current.fence().unwrap_or(0);
                        begin(
                            &w2,
                            seq,
                            &body_state,
                            current.token(),
                            fence,
                            Duration::ZERO,
                        );
                        watch_loss(&body_state, current.clone());
                        *body_held.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(current.clone());
                        let _stamp = StopStamp(body_state.clone());
                        lock(&body_state).read = store_call(&store.call(fence, "read", 0).await);
                        let _ = started_tx.send(());
                        std::future::pending::<Result<(), LockError>>().await
                    }),
            );
            let hold = Duration::from_millis(1 + rand_below(self.hold_max_ms));
            tokio::select! {
                outcome = &mut run => {
                    match outcome {
                        Ok(()) => unreachable!("the body never finishes"),
                        Err(e) if lock(&s).start != 0 => end_record(w, seq, &s, Outcome::from(&e)),
                        Err(e) => err_record(w, seq, &e),
                    }
                    return;
                }
                () = async { let _ = started.await; tokio::time::sleep(hold).await; } => {}
            }
            let lost = held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(lock_runtime::CurrentLock::is_lost);
            body_over(w, seq, &s, now_us(), lost);
            drop_timed(w, seq, &s, Dropped::Future, run);
        } else {
            let guard = match self
                .registry
                .lock(self.key.clone())
                .ttl(self.ttl)
                .wait(self.wait)
                .fencing(self.fencing)
                .acquire()
                .await
            {
                Ok(g) => g,
                Err(e) => {
                    err_record(w, seq, &e);
                    return;
                }
            };
            let hold = Duration::from_millis(1 + rand_below(self.hold_max_ms));
            begin(w, seq, &s, guard.token(), guard.fence().unwrap_or(0), hold);
            let sleep = tokio::time::sleep(hold);
            tokio::pin!(sleep);
            tokio::select! {
                () = &mut sleep => {}
                _ = guard.lost() => {
                    note_loss(&s);
                    sleep.await;
                }
            }
            body_over(w, seq, &s, now_us(), guard.is_lost());
            drop_timed(w, seq, &s, Dropped::Guard, guard);
        }
    }

    async fn task(&self, index: usize, w: String, on_lost: OnLost, with_drops: bool) -> u64 {
        let mut seq = 0;
        while !self.stop.load(Ordering::SeqCst) {
            seq += 1;
            // Taken by the body once it runs: a section that could not acquire leaves the
            // request for the next one.
            let forced = self.long_requests[index].load(Ordering::SeqCst);
            if forced > 0 {
                self.section(&w, seq, on_lost, Some((index, forced))).await;
            } else if with_drops && self.drop_every > 0 && seq % self.drop_every == 0 {
                self.drop_test(&w, seq).await;
            } else {
                self.section(&w, seq, on_lost, None).await;
            }
        }
        seq
    }
}

/// The slot of `long_requests` the leader's term reads.
const LEADER_SLOT: usize = 2;

/// The hold a body uses: `asked` if the test's request for it is still standing (the test
/// withdraws it once another worker took it), which this body then takes; else `usual`.
fn take_request(request: &AtomicU64, asked: u64, usual: Duration) -> Duration {
    if asked > 0
        && request
            .compare_exchange(asked, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        Duration::from_millis(asked)
    } else {
        usual
    }
}

/// Reports every moment the runtime could not run its heartbeat within [`Record::LATE`] of its
/// time.
async fn heartbeat(w: String, stop: Arc<AtomicBool>) -> Duration {
    let mut worst = Duration::ZERO;
    let mut next = tokio::time::Instant::now() + Record::HEARTBEAT;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep_until(next).await;
        let late = tokio::time::Instant::now().saturating_duration_since(next);
        worst = worst.max(late);
        if late >= Record::LATE {
            out(&Record::Stall {
                w: w.clone(),
                at: now_us(),
                late_us: micros(late),
            });
        }
        next = tokio::time::Instant::now() + Record::HEARTBEAT;
    }
    worst
}

async fn workload(args: Args) {
    let id = args.str("id");
    let key = args.str("key");
    let stop = Arc::new(AtomicBool::new(false));
    let long_requests = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let stdin_stop = stop.clone();
    let requests = long_requests.clone();
    std::thread::spawn(move || {
        // `long <ms> <task>` asks for one long section of task 0 or 1 (the register's) or `l`
        // (a leader's term); EOF (the test closed stdin, or died) stops the workload.
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if let (Some("long"), Some(ms), Some(task)) = (words.next(), words.next(), words.next())
            {
                let slot = match task {
                    "0" => 0,
                    "1" => 1,
                    _ => LEADER_SLOT,
                };
                if let Ok(ms) = ms.parse::<u64>() {
                    requests[slot].store(ms, Ordering::SeqCst);
                }
            }
        }
        stdin_stop.store(true, Ordering::SeqCst);
    });
    let work = Workload {
        registry: registry(&args),
        store: Store::connect(&args.str("store-url"), &key).await,
        key,
        ttl: args.ms("ttl-ms", 1000),
        wait: args.ms("wait-ms", 2000),
        hold_max_ms: args.num("hold-max-ms", 20),
        long_pct: args.num("long-pct", 5),
        drop_every: args.num("drop-every", 8),
        fencing: args.num("fencing", 1) == 1,
        stop: stop.clone(),
        long_requests,
    };
    out(&Record::Ready {
        w: id.clone(),
        pid: std::process::id(),
    });
    let tasks = usize::try_from(args.num("tasks", 2).clamp(1, 2)).expect("small");
    let kinds = Kinds::from(&args);
    let mut loops: Vec<std::pin::Pin<Box<dyn Future<Output = u64> + '_>>> = Vec::new();
    for t in 0..tasks {
        // Task 0 cancels on loss (the default); task 1 lets the body finish and reports.
        let on_lost = if t % 2 == 0 {
            OnLost::Cancel
        } else {
            OnLost::Continue
        };
        loops.push(Box::pin(work.task(t, format!("{id}.{t}"), on_lost, t == 0)));
    }
    if let Some(kinds) = &kinds {
        for kind in Kind::ALL {
            let w = format!("{id}.{}", kind.task());
            loops.push(Box::pin(work.kind_task(kinds, kind, w)));
        }
    }
    let (counts, worst) = tokio::join!(join_all(loops), heartbeat(id.clone(), stop.clone()));
    out(&Record::Done {
        w: id,
        iterations: counts.iter().sum::<u64>(),
        worst_heartbeat_ms: millis(worst),
    });
}

/// Stops this very process (SIGSTOP) until someone sends SIGCONT: a pause at an exact point.
fn pause_self() {
    let status = std::process::Command::new("kill")
        .arg("-STOP")
        .arg(std::process::id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -STOP self failed");
}

async fn victim(args: Args) {
    let registry = registry(&args);
    let key = args.str("key");
    let store = Store::connect(&args.str("store-url"), &key).await;
    let fencing = args.num("fencing", 1) == 1;
    let write_after = args.0.get("after-pause").is_none_or(|v| v == "write");
    let pause = args.0.get("pause").is_none_or(|v| v == "yes");
    let on_lost = match args.0.get("on-lost").map(String::as_str) {
        Some("continue") => OnLost::Continue,
        _ => OnLost::Cancel,
    };
    let in_flight = std::sync::Mutex::new(None::<tokio::task::JoinHandle<()>>);
    let outcome = registry
        .lock(key)
        .ttl(args.ms("ttl-ms", 1000))
        .wait(args.ms("wait-ms", 0))
        .fencing(fencing)
        .on_lost(on_lost)
        .run(async {
            let current = lock_runtime::current().expect("inside the body");
            let fence = current.fence().unwrap_or(0);
            let read = if fencing {
                store
                    .call(fence, "read", 0)
                    .await
                    .expect("store")
                    .expect("fresh fence")
            } else {
                store.plain_read().await.expect("store")
            };
            if pause {
                out(&Record::Pausing { fence, read });
                pause_self();
                out(&Record::Resumed {
                    lost_seen: current.is_lost(),
                });
            }
            if write_after {
                // The process stopped in the middle of sending its write: once it resumes the
                // write is on its way whatever the lock does (a cancelled body included), so it
                // runs as a task of its own. Fencing, not the lock, is what can refuse it.
                let store = store.clone();
                let (done, written) = tokio::sync::oneshot::channel();
                let write = tokio::spawn(async move {
                    let accepted = if fencing {
                        store
                            .call(fence, "write", read + 1)
                            .await
                            .expect("store")
                            .is_some()
                    } else {
                        store.plain_write(read + 1).await.expect("store");
                        true
                    };
                    out(&Record::Wrote { accepted });
                    let _ = done.send(());
                });
                *in_flight.lock().expect("not poisoned") = Some(write);
                written.await.expect("the write task");
            }
            Ok::<_, LockError>(())
        })
        .await;
    // A body cancelled while its write was in flight: the write still lands before `exit`.
    let write = in_flight.lock().expect("not poisoned").take();
    if let Some(write) = write {
        write.await.expect("the write task");
    }
    out(&Record::Outcome {
        outcome: outcome
            .as_ref()
            .map_or_else(Outcome::from, |()| Outcome::Ok),
    });
    // Whatever the store got from this process was sent before this record.
    out(&Record::Exit);
}

async fn tokens(args: Args) {
    let registry = Registry::in_memory();
    for i in 0..args.num("count", 100) {
        let guard = registry
            .lock(format!("t{i}"))
            .acquire()
            .await
            .expect("in-memory lock");
        out(&Record::Token {
            token: guard.token().to_owned(),
        });
        guard.release().await.expect("release");
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let mode = argv
        .next()
        .expect("usage: fault-worker workload|victim|tokens --name value ..");
    let args = Args::parse(argv);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match mode.as_str() {
        "workload" => runtime.block_on(workload(args)),
        "victim" => runtime.block_on(victim(args)),
        "tokens" => runtime.block_on(tokens(args)),
        other => panic!("unknown mode {other}"),
    }
}
