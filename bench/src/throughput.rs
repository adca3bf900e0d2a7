//! Item 5: acquire + release cycles per second with many concurrent tasks on distinct keys,
//! all over one client (one registry, manager or locker).
//!
//! Rounds alternate between the libraries (who goes first rotates), and each library's figure
//! is the median of its rounds, so a burst of load elsewhere on the machine hits one round of
//! each rather than one library.
//!
//! Each round also runs lock-runtime's two commands by hand (`SET NX PX` and its release
//! script, no library) on one plain `MultiplexedConnection`: what redis-rs and the server cost for
//! the protocol alone, the ceiling for any library that sends these two commands.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::libs::{Client, Lib, PerLib};
use crate::procfs;
use crate::redis_stats::Info;

const WARM_UP: Duration = Duration::from_millis(300);

#[derive(Clone, Debug, Default)]
pub struct Throughput {
    /// Cycles per second, one per round.
    pub rounds: Vec<f64>,
    pub errors: u64,
    /// CPU time per second of the window, summed over rounds: this client process, and the
    /// redis-server. Either near 1 core per core it can use says what limits the rate.
    pub client_cpu: f64,
    pub server_cpu: f64,
    pub secs: f64,
    /// Commands the server executed per cycle (inside scripts too).
    pub commands: u64,
    pub cycles: u64,
}

impl Throughput {
    pub fn median(&self) -> f64 {
        let mut r = self.rounds.clone();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(0.0)
    }
}

/// What the tasks of a round run.
enum Cycler {
    Lib(Arc<Client>),
    /// `SET NX PX` and the release script on a shared plain connection.
    Raw(MultiplexedConnection, Arc<redis::Script>),
}

impl Cycler {
    /// The protocol by hand, on a connection of its own.
    async fn raw(url: &str) -> Self {
        Cycler::Raw(
            redis::Client::open(url)
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("multiplexed connection"),
            Arc::new(redis::Script::new(lock_runtime::protocol::RELEASE_LUA)),
        )
    }

    async fn cycle(&self, key: &str, token: &str) -> Result<(), String> {
        match self {
            Cycler::Lib(client) => client.cycle(key).await,
            Cycler::Raw(con, script) => {
                let mut con = con.clone();
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut con)
                    .await
                    .map_err(|e| e.to_string())?;
                if set.is_none() {
                    return Err("busy".to_owned());
                }
                let released: i64 = script
                    .key(key)
                    .arg(token)
                    .arg("PUBLISH")
                    .invoke_async(&mut con)
                    .await
                    .map_err(|e| e.to_string())?;
                if released == 1 {
                    Ok(())
                } else {
                    Err("not released".to_owned())
                }
            }
        }
    }
}

/// The libraries' figures, and the protocol's by hand.
pub struct Rounds {
    pub libs: PerLib<Throughput>,
    pub raw: Throughput,
}

pub async fn measure(url: &str, tasks: usize, window: Duration, rounds: usize) -> Rounds {
    let mut cyclers = Vec::new();
    for lib in Lib::ALL {
        cyclers.push(Cycler::Lib(Arc::new(Client::connect(lib, url).await)));
    }
    let raw = Cycler::raw(url).await;
    let mut raw_out = Throughput::default();
    let mut stats = lock_tests::connection(url);
    let mut out = PerLib::<Throughput>::default();
    for round in 0..rounds {
        for k in 0..=Lib::ALL.len() {
            // The hand-sent protocol takes its turn in the rotation like a fourth library.
            let turn = (round + k) % (Lib::ALL.len() + 1);
            match Lib::ALL.get(turn) {
                Some(&lib) => {
                    let t = out.get_mut(lib);
                    one_round(&cyclers[turn], lib.id(), tasks, window, &mut stats, t).await;
                }
                None => one_round(&raw, "raw", tasks, window, &mut stats, &mut raw_out).await,
            }
        }
    }
    Rounds {
        libs: out,
        raw: raw_out,
    }
}

async fn one_round(
    cycler: &Cycler,
    name: &str,
    tasks: usize,
    window: Duration,
    stats: &mut redis::Connection,
    out: &mut Throughput,
) {
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cycler = Arc::new(match cycler {
        Cycler::Lib(client) => Cycler::Lib(client.clone()),
        Cycler::Raw(con, script) => Cycler::Raw(con.clone(), script.clone()),
    });
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let cycler = cycler.clone();
        let (cycles, errors, stop) = (cycles.clone(), errors.clone(), stop.clone());
        let key = format!("tp:{name}:{i}");
        let token = format!(
            "bench:{}:{i}:00000000000000000000000000000000",
            std::process::id()
        );
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match cycler.cycle(&key, &token).await {
                    Ok(()) => cycles.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    tokio::time::sleep(WARM_UP).await;
    let info_before = Info::take(stats);
    let cpu_before = procfs::process_cpu();
    let (before, started) = (cycles.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(window).await;
    let (after, elapsed) = (cycles.load(Ordering::Relaxed), started.elapsed());
    let cpu_after = procfs::process_cpu();
    let info_after = Info::take(stats);
    stop.store(true, Ordering::Relaxed);
    while set.join_next().await.is_some() {}
    out.rounds
        .push((after - before) as f64 / elapsed.as_secs_f64());
    out.errors += errors.load(Ordering::Relaxed);
    out.client_cpu += (cpu_after - cpu_before).as_secs_f64();
    out.server_cpu += info_after.cpu_secs - info_before.cpu_secs;
    out.secs += elapsed.as_secs_f64();
    out.commands += info_after.total_delta(&info_before);
    out.cycles += after - before;
}

/// One library (a `Lib` id) or the protocol by hand (`raw`) alone, `tasks` tasks for `window`:
/// for a profiler, which sees one client's work and nothing else's. Prints cycles per second
/// and CPU per cycle.
pub async fn profile(url: &str, which: &str, tasks: usize, window: Duration) {
    let cycler = match Lib::from_id(which) {
        Some(lib) => Cycler::Lib(Arc::new(Client::connect(lib, url).await)),
        None => Cycler::raw(url).await,
    };
    let mut stats = lock_tests::connection(url);
    let mut t = Throughput::default();
    one_round(&cycler, which, tasks, window, &mut stats, &mut t).await;
    println!(
        "{which}, {tasks} tasks: {:.0} cycles/s; CPU per cycle: client {:.1} µs, server {:.1} µs; \
         {:.1} server commands per cycle; errors: {}",
        t.median(),
        t.client_cpu / t.cycles as f64 * 1e6,
        t.server_cpu / t.cycles as f64 * 1e6,
        t.commands as f64 / t.cycles as f64,
        t.errors
    );
}
