//! Item 3: the time from the holder starting its release to a blocked waiter holding the lock.
//!
//! Holder and waiter are two clients (two registries, managers or lockers: two processes as far
//! as Redis can tell). The waiter is started, then the holder keeps the lock for 5 ms plus a
//! uniform share of the library's poll period, so polling waiters are caught at every phase of
//! their sleep rather than always at the same one.
//!
//! A handoff starts after the process sat idle for a few milliseconds, so its round trips are
//! "cold" (worker threads parked), while item 1's RTT is measured back to back. For scale, a
//! PING after the same idle time is measured too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::libs::{Client, Lib, PerLib, Pinger, TTL};
use crate::stats::{Rng, Samples};

pub struct Handoff {
    pub samples: PerLib<Samples>,
    /// PING on lock-runtime's kind of client after the same idle time as a lock-runtime handoff.
    pub cold_rtt: Samples,
    /// lock-runtime's holder: from the start of its release to the release returning, in the
    /// same handoffs (the release's own round trip, through the library).
    pub release: Samples,
}

pub async fn measure(url: &str, notified_samples: usize, polling_samples: usize) -> Handoff {
    let mut pinger = Pinger::connect(Lib::Runtime, url).await;
    let mut cold = Vec::new();
    let mut releases = Vec::new();
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for lib in Lib::ALL {
        let holder = Client::connect(lib, url).await;
        let waiter = Client::connect(lib, url).await;
        for _ in 0..50 {
            holder.cycle("handoff:warm").await.expect("warm-up");
            waiter.cycle("handoff:warm").await.expect("warm-up");
        }
        holders.push(holder);
        waiters.push(Arc::new(waiter));
    }
    let wanted = |lib: Lib| {
        if lib.poll_period().is_some() {
            polling_samples
        } else {
            notified_samples
        }
    };
    let mut rng = Rng::seeded();
    let mut samples = PerLib::<Vec<Duration>>::default();
    loop {
        let mut done = true;
        for lib in Lib::ALL {
            if samples.get(lib).len() >= wanted(lib) {
                continue;
            }
            done = false;
            let i = lib as usize;
            let (sample, release) = one(&holders[i], &waiters[i], lib, &mut rng).await;
            samples.get_mut(lib).push(sample);
            if lib == Lib::Runtime {
                releases.push(release);
                tokio::time::sleep(idle(lib, &mut rng)).await;
                cold.push(pinger.ping().await);
            }
        }
        if done {
            break;
        }
    }
    Handoff {
        samples: PerLib(samples.0.map(Samples::new)),
        cold_rtt: Samples::new(cold),
        release: Samples::new(releases),
    }
}

/// How long the holder keeps the lock after the waiter started.
fn idle(lib: Lib, rng: &mut Rng) -> Duration {
    let spread = lib.poll_period().unwrap_or(Duration::from_millis(5));
    Duration::from_millis(5) + rng.below(spread)
}

/// The handoff, and the holder's release call, both from the start of the release.
async fn one(
    holder: &Client,
    waiter: &Arc<Client>,
    lib: Lib,
    rng: &mut Rng,
) -> (Duration, Duration) {
    let key = format!("handoff:{}", lib.id());
    let held = holder
        .acquire(&key, TTL, Duration::ZERO)
        .await
        .expect("the handoff key is free");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let waiter = waiter.clone();
    let waiter_key = key.clone();
    let task = tokio::spawn(async move {
        let _ = started_tx.send(());
        let guard = waiter
            .acquire(&waiter_key, TTL, Duration::from_secs(30))
            .await
            .expect("the waiter gets the lock");
        let at = Instant::now();
        guard.release().await.expect("release");
        at
    });
    let _ = started.await;
    tokio::time::sleep(idle(lib, rng)).await;
    let release_started = Instant::now();
    held.release().await.expect("release");
    let released = release_started.elapsed();
    let acquired_at = task.await.expect("waiter task");
    (
        acquired_at.saturating_duration_since(release_started),
        released,
    )
}

/// `--profile wakeups N`: where a lock-runtime handoff's time goes, against a PING after the
/// same idle time on a connection driven on the calling runtime and on one driven on a thread
/// of its own (as lock-runtime's connections are, on its I/O thread). For each, the median and
/// how many times each thread (this process's, and redis-server's) parked within the measured
/// span (from the release's start to the waiter holding; the PING's round trip): each parking
/// is a thread wake-up on the path.
pub async fn profile(url: &str, server_pid: u32, samples: usize) {
    let holder = Client::connect(Lib::Runtime, url).await;
    let waiter = Arc::new(Client::connect(Lib::Runtime, url).await);
    let mut local = Pinger::connect(Lib::Runtime, url).await;
    let mut remote = crate::libs::remote_connection(url);
    for _ in 0..50 {
        holder.cycle("handoff:warm").await.expect("warm-up");
        waiter.cycle("handoff:warm").await.expect("warm-up");
        local.ping().await;
        remote.ping().await;
    }
    let parkings = || parkings(server_pid);
    let mut server = lock_tests::connection(url);
    let _: () = redis::pipe()
        .cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .ignore()
        .cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(20 * samples + 100)
        .ignore()
        .cmd("SLOWLOG")
        .arg("RESET")
        .ignore()
        .query(&mut server)
        .expect("the server's slow log");
    let mut rng = Rng::seeded();
    let mut handoffs = Span::default();
    let mut releases = Vec::new();
    for _ in 0..samples {
        let key = "handoff:profile";
        let held = holder
            .acquire(key, TTL, Duration::ZERO)
            .await
            .expect("the handoff key is free");
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (holding_tx, holding) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        let waiter = waiter.clone();
        let task = tokio::spawn(async move {
            let _ = started_tx.send(());
            let guard = waiter
                .acquire(key, TTL, Duration::from_secs(30))
                .await
                .expect("the waiter gets the lock");
            let _ = holding_tx.send(Instant::now());
            let _ = done.await;
            guard.release().await.expect("release");
        });
        let _ = started.await;
        tokio::time::sleep(idle(Lib::Runtime, &mut rng)).await;
        let before = parkings();
        let release_started = Instant::now();
        held.release().await.expect("release");
        releases.push(release_started.elapsed());
        let holding = holding.await.expect("the waiter holds");
        handoffs.add(holding - release_started, &before, &parkings());
        let _ = done_tx.send(());
        task.await.expect("waiter task");
    }
    handoffs.print("lock-runtime handoff", samples);
    println!(
        "  of which the holder's release() call: median {}",
        crate::stats::dur(Samples::new(releases).median())
    );
    server_time_of_scripts(&mut server, samples);
    for (what, pinger) in [
        ("cold PING, driver on the calling runtime", &mut local),
        ("cold PING, driver on a thread of its own", &mut remote),
    ] {
        let mut pings = Span::default();
        for _ in 0..samples {
            tokio::time::sleep(idle(Lib::Runtime, &mut rng)).await;
            let before = parkings();
            let took = pinger.ping().await;
            pings.add(took, &before, &parkings());
        }
        pings.print(what, samples);
    }
}

/// The server's own time inside each script the handoffs ran (its slow log, which times every
/// command from 0 µs up): per sample the waiter's queueing acquisition, the holder's release
/// that hands the lock over, and the waiter's release of a lock nobody waits for.
fn server_time_of_scripts(server: &mut redis::Connection, samples: usize) {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(20 * samples + 100)
        .query(server)
        .expect("SLOWLOG GET");
    // Newest first: [id, unix time, µs, [command, args..], client, name].
    let scripts: Vec<(String, String, Duration)> = entries
        .iter()
        .filter_map(|entry| {
            let redis::Value::Array(fields) = entry else {
                return None;
            };
            let micros: u64 = redis::from_redis_value_ref(fields.get(2)?).ok()?;
            let args: Vec<String> = redis::from_redis_value_ref(fields.get(3)?).ok()?;
            let client: String = redis::from_redis_value_ref(fields.get(4)?).ok()?;
            if !args.first()?.eq_ignore_ascii_case("evalsha") {
                return None;
            }
            Some((args.get(1)?.clone(), client, Duration::from_micros(micros)))
        })
        .collect();
    let hash = |lua: &str| redis::Script::new(lua).get_hash().to_owned();
    let (acquire, release) = (
        hash(lock_runtime::protocol::ACQUIRE_LUA),
        hash(lock_runtime::protocol::RELEASE_LUA),
    );
    // The waiter is the client that runs the acquire script; the holder releases the other way.
    let waiter = scripts
        .iter()
        .find(|(sha, _, _)| *sha == acquire)
        .map(|(_, client, _)| client.clone())
        .unwrap_or_default();
    for (what, sha, by_waiter) in [
        ("the waiter's acquire script (queues it)", &acquire, true),
        ("the holder's release script (hands over)", &release, false),
        ("the waiter's release script (nobody waits)", &release, true),
    ] {
        let times: Vec<Duration> = scripts
            .iter()
            .filter(|(s, client, _)| s == sha && (*client == waiter) == by_waiter)
            .map(|(_, _, d)| *d)
            .collect();
        let n = times.len();
        let times = Samples::new(times);
        println!(
            "  server time in {what}: median {} (p90 {}, {n} calls in {samples} samples)",
            crate::stats::dur(times.median()),
            crate::stats::dur(times.quantile(0.9)),
        );
    }
}

/// How many times each thread of this process and of the server (`server_pid`) parked so far.
pub fn parkings(server_pid: u32) -> BTreeMap<String, u64> {
    let mut all = crate::procfs::parkings_by_thread(std::process::id());
    for (name, n) in crate::procfs::parkings_by_thread(server_pid) {
        *all.entry(format!("{name} (server)")).or_default() += n;
    }
    all
}

/// Measured spans and the parkings in them, by thread name.
#[derive(Default)]
pub struct Span {
    times: Vec<Duration>,
    parkings: BTreeMap<String, u64>,
}

impl Span {
    pub fn add(
        &mut self,
        took: Duration,
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
    ) {
        self.times.push(took);
        for (name, n) in after {
            let new = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            *self.parkings.entry(name.clone()).or_default() += new;
        }
    }

    pub fn print(self, what: &str, samples: usize) {
        let per_sample: Vec<String> = self
            .parkings
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| format!("{name} {:.2}", *n as f64 / samples as f64))
            .collect();
        let times = Samples::new(self.times);
        println!(
            "{what}: median {} (p90 {}); parkings per sample: {}",
            crate::stats::dur(times.median()),
            crate::stats::dur(times.quantile(0.9)),
            per_sample.join(", ")
        );
    }
}
