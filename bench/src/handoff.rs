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
