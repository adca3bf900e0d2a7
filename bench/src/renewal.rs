//! Item 7: many locks held at once with a short lease, renewed for a fixed time.
//!
//! Each library runs in a fresh child process (`lock-bench --child-renewal ...`) on a
//! current-thread Tokio runtime, so the process's CPU time is what holding and renewing the
//! locks costs (lock-runtime: its lease keeper and the connection it writes to; the peers: one
//! renewal task per lock), and its resident memory is not shared with any other scenario
//! (item 9, [`crate::memory`]).
//!
//! The server side comes from `INFO`: script calls (each renewal command is a script call:
//! one per lock for the peers, one per batch of up to 512 locks for lock-runtime), all commands
//! executed (inside scripts too), and the server's CPU time. lock-runtime's keeper also reports
//! each renewal batch as a `tracing` event, which a small subscriber counts here.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::libs::{Client, Held, Lib};
use crate::memory::{self, Memory};
use crate::procfs;
use crate::redis_stats::Info;

/// The lease of every lock in this scenario.
pub const TTL: Duration = Duration::from_secs(3);
/// Locks are taken this many at a time.
const WAVE: usize = 500;

#[derive(Clone, Debug, Default)]
pub struct Renewal {
    pub locks: usize,
    /// The measured window.
    pub secs: f64,
    /// How long taking all the locks took.
    pub acquire_secs: f64,
    pub memory: Memory,
    /// CPU time of the whole client process in the window.
    pub cpu_process: f64,
    /// CPU time of the runtime thread in the window.
    pub cpu_thread: f64,
    /// `EVALSHA`/`EVAL` calls in the window: the renewal commands, one round trip each.
    pub script_calls: u64,
    /// Every command the server executed in the window, inside scripts too.
    pub all_commands: u64,
    /// Server CPU time in the window.
    pub redis_cpu: f64,
    /// Leases the library reported lost.
    pub lost_reported: u64,
    /// Lock keys still holding at the end.
    pub present: u64,
    /// lock-runtime only: renewal batches, locks renewed in them, slowest batch.
    pub batches: u64,
    pub batch_locks: u64,
    pub batch_max_us: u64,
}

impl Renewal {
    pub fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.secs
    }

    pub fn cpu_share(&self) -> f64 {
        self.cpu_process / self.secs
    }

    pub fn lost(&self) -> u64 {
        self.lost_reported
            .max(self.locks as u64 - self.present.min(self.locks as u64))
    }

    fn to_line(&self) -> String {
        format!(
            "RESULT locks={} secs={} acquire_secs={} rss_before={} rss_after={} cpu_process={} \
             cpu_thread={} script_calls={} all_commands={} redis_cpu={} lost_reported={} \
             present={} batches={} batch_locks={} batch_max_us={}",
            self.locks,
            self.secs,
            self.acquire_secs,
            self.memory.before,
            self.memory.after,
            self.cpu_process,
            self.cpu_thread,
            self.script_calls,
            self.all_commands,
            self.redis_cpu,
            self.lost_reported,
            self.present,
            self.batches,
            self.batch_locks,
            self.batch_max_us,
        )
    }

    fn from_line(line: &str) -> Option<Renewal> {
        let fields: HashMap<&str, &str> = line
            .strip_prefix("RESULT ")?
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let int = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let float = |k: &str| fields.get(k).and_then(|v| v.parse::<f64>().ok());
        let locks = usize::try_from(int("locks")?).ok()?;
        Some(Renewal {
            locks,
            secs: float("secs")?,
            acquire_secs: float("acquire_secs")?,
            memory: Memory {
                before: int("rss_before")?,
                after: int("rss_after")?,
                locks,
            },
            cpu_process: float("cpu_process")?,
            cpu_thread: float("cpu_thread")?,
            script_calls: int("script_calls")?,
            all_commands: int("all_commands")?,
            redis_cpu: float("redis_cpu")?,
            lost_reported: int("lost_reported")?,
            present: int("present")?,
            batches: int("batches")?,
            batch_locks: int("batch_locks")?,
            batch_max_us: int("batch_max_us")?,
        })
    }
}

/// Runs the scenario for `lib` in a child process and reads its result.
pub fn run(lib: Lib, url: &str, secs: u64, locks: usize) -> Renewal {
    let exe = std::env::current_exe().expect("path of this binary");
    let output = std::process::Command::new(exe)
        .args(["--child-renewal", lib.id(), url])
        .arg(secs.to_string())
        .arg(locks.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("start the renewal child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(Renewal::from_line)
        .unwrap_or_else(|| {
            panic!(
                "the renewal child for {} failed ({}): {stdout}",
                lib.name(),
                output.status
            )
        })
}

/// The child's side: `--child-renewal <lib> <url> <secs> <locks>`.
pub fn child(args: &[String]) {
    let [lib, url, secs, locks] = args else {
        panic!("usage: --child-renewal <lib> <url> <secs> <locks>");
    };
    let lib = Lib::from_id(lib).expect("a library id");
    let secs: u64 = secs.parse().expect("seconds");
    let locks: usize = locks.parse().expect("lock count");
    let keeper = Arc::new(KeeperEvents::default());
    if lib == Lib::Runtime {
        tracing::subscriber::set_global_default(KeeperSubscriber(keeper.clone()))
            .expect("the only subscriber");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(hold_and_renew(lib, url, secs, locks, &keeper));
    println!("{}", result.to_line());
}

/// The held locks, as each library hands them out (no wrapper, so item 9 counts only them).
enum Holding {
    Runtime(Vec<lock_runtime::LockGuard>),
    Arl(Vec<async_redis_lock::Lock>),
    Tasks {
        stop: tokio::sync::watch::Sender<bool>,
        tasks: tokio::task::JoinSet<()>,
        failed: Arc<AtomicUsize>,
    },
}

fn key(i: usize) -> String {
    format!("renew:{i}")
}

async fn hold_and_renew(
    lib: Lib,
    url: &str,
    secs: u64,
    locks: usize,
    keeper: &KeeperEvents,
) -> Renewal {
    let client = Arc::new(Client::connect(lib, url).await);
    client
        .acquire("renew:warm", TTL, Duration::ZERO)
        .await
        .expect("warm-up lock")
        .release()
        .await
        .expect("warm-up release");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = memory::resident();
    let started = Instant::now();
    let holding = match &*client {
        Client::Rslock(manager) => hold_rslock(manager, locks).await,
        _ => {
            let mut guards = Vec::new();
            let mut arl = Vec::new();
            for wave in (0..locks).step_by(WAVE) {
                let mut set = tokio::task::JoinSet::new();
                for i in wave..(wave + WAVE).min(locks) {
                    let client = client.clone();
                    set.spawn(async move { client.acquire(&key(i), TTL, Duration::ZERO).await });
                }
                while let Some(outcome) = set.join_next().await {
                    match outcome.expect("task").expect("acquire") {
                        Held::Runtime(guard) => guards.push(guard),
                        Held::Arl(lock) => arl.push(*lock),
                        Held::Rslock(_) => unreachable!("rslock holds through `using`"),
                    }
                }
            }
            if lib == Lib::Runtime {
                Holding::Runtime(guards)
            } else {
                Holding::Arl(arl)
            }
        }
    };
    let acquire_secs = started.elapsed().as_secs_f64();
    let after = memory::resident();

    let mut con = lock_tests::connection(url);
    let info_before = Info::take(&mut con);
    let (process_before, thread_before) = (procfs::process_cpu(), procfs::thread_cpu());
    let keeper_before = keeper.snapshot();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let secs = window.elapsed().as_secs_f64();
    let (process_after, thread_after) = (procfs::process_cpu(), procfs::thread_cpu());
    let keeper_after = keeper.snapshot();
    let info_after = Info::take(&mut con);

    let lost_reported = match &holding {
        Holding::Runtime(guards) => guards.iter().filter(|g| g.is_lost()).count(),
        Holding::Arl(locks) => locks.iter().filter(|l| l.is_lost()).count(),
        Holding::Tasks { failed, .. } => failed.load(Ordering::Relaxed),
    };
    let prefix = if lib == Lib::Runtime { "lock:" } else { "" };
    let mut present = 0u64;
    for chunk in (0..locks).collect::<Vec<_>>().chunks(WAVE) {
        let mut exists = redis::cmd("EXISTS");
        for &i in chunk {
            exists.arg(format!("{prefix}{}", key(i)));
        }
        present += exists.query::<u64>(&mut con).expect("EXISTS");
    }
    release(holding).await;

    Renewal {
        locks,
        secs,
        acquire_secs,
        memory: Memory {
            before,
            after,
            locks,
        },
        cpu_process: (process_after - process_before).as_secs_f64(),
        cpu_thread: (thread_after - thread_before).as_secs_f64(),
        script_calls: info_after.delta(&info_before, "evalsha")
            + info_after.delta(&info_before, "eval"),
        all_commands: info_after.total_delta(&info_before),
        redis_cpu: info_after.cpu_secs - info_before.cpu_secs,
        lost_reported: (lost_reported as u64).max(keeper_after.lost),
        present,
        batches: keeper_after.batches - keeper_before.batches,
        batch_locks: keeper_after.locks - keeper_before.locks,
        batch_max_us: keeper_after.max_us,
    }
}

/// rslock renews only inside `LockManager::using`: one task per lock runs it until told to stop.
async fn hold_rslock(manager: &rslock::LockManager, locks: usize) -> Holding {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let acquired = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for wave in (0..locks).step_by(WAVE) {
        let end = (wave + WAVE).min(locks);
        for i in wave..end {
            let manager = manager.clone();
            let mut stopped = stopped.clone();
            let (acquired, failed) = (acquired.clone(), failed.clone());
            tasks.spawn(async move {
                let resource = key(i);
                let outcome = manager
                    .using(resource.as_bytes(), TTL, async move || {
                        acquired.fetch_add(1, Ordering::SeqCst);
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await;
                if outcome.is_err() {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        while acquired.load(Ordering::SeqCst) < end {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Holding::Tasks {
        stop,
        tasks,
        failed,
    }
}

async fn release(holding: Holding) {
    match holding {
        Holding::Runtime(guards) => {
            release_in_waves(guards, lock_runtime::LockGuard::release).await;
        }
        Holding::Arl(locks) => {
            release_in_waves(locks, async_redis_lock::Lock::release).await;
        }
        Holding::Tasks {
            stop, mut tasks, ..
        } => {
            let _ = stop.send(true);
            while tasks.join_next().await.is_some() {}
        }
    }
}

async fn release_in_waves<T, F, Fut, E>(mut held: Vec<T>, release: F)
where
    T: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
{
    while !held.is_empty() {
        let mut set = tokio::task::JoinSet::new();
        for h in held.drain(..WAVE.min(held.len())) {
            set.spawn(release(h));
        }
        while set.join_next().await.is_some() {}
    }
}

/// What lock-runtime's keeper reported through `tracing`.
#[derive(Default)]
struct KeeperEvents {
    batches: AtomicU64,
    locks: AtomicU64,
    max_us: AtomicU64,
    lost: AtomicU64,
}

#[derive(Clone, Copy)]
struct KeeperSnapshot {
    batches: u64,
    locks: u64,
    max_us: u64,
    lost: u64,
}

impl KeeperEvents {
    fn snapshot(&self) -> KeeperSnapshot {
        KeeperSnapshot {
            batches: self.batches.load(Ordering::Relaxed),
            locks: self.locks.load(Ordering::Relaxed),
            max_us: self.max_us.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
        }
    }
}

struct KeeperSubscriber(Arc<KeeperEvents>);

#[derive(Default)]
struct Fields {
    message: String,
    locks: u64,
    elapsed_us: u64,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "locks" => self.locks = value,
            "elapsed_us" => self.elapsed_us = value,
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for KeeperSubscriber {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target().starts_with("lock_runtime")
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let counts = &self.0;
        match fields.message.as_str() {
            "renewed" => {
                counts.batches.fetch_add(1, Ordering::Relaxed);
                counts.locks.fetch_add(fields.locks, Ordering::Relaxed);
                counts
                    .max_us
                    .fetch_max(fields.elapsed_us, Ordering::Relaxed);
            }
            "lock lease lost" => {
                counts.lost.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
