//! Item 6: many tasks on one key, each taking the lock again as soon as it released it.
//!
//! Counted in a fixed window: acquisitions, handoffs (an acquisition by another task than the
//! previous holder), and fairness as the most over the fewest acquisitions of one task.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::libs::{Client, Lib, PerLib, TTL};

const WARM_UP: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Default)]
pub struct Contention {
    pub secs: f64,
    pub per_task: Vec<u64>,
    pub handoffs: u64,
    pub errors: u64,
}

impl Contention {
    pub fn acquisitions(&self) -> u64 {
        self.per_task.iter().sum()
    }

    pub fn acquisitions_per_sec(&self) -> f64 {
        self.acquisitions() as f64 / self.secs
    }

    pub fn handoffs_per_sec(&self) -> f64 {
        self.handoffs as f64 / self.secs
    }

    pub fn max(&self) -> u64 {
        self.per_task.iter().copied().max().unwrap_or(0)
    }

    pub fn min(&self) -> u64 {
        self.per_task.iter().copied().min().unwrap_or(0)
    }

    /// Tasks that never got the lock in the window.
    pub fn starved(&self) -> usize {
        self.per_task.iter().filter(|&&n| n == 0).count()
    }

    /// `max/min`, or `None` when some task starved.
    pub fn fairness(&self) -> Option<f64> {
        (self.min() > 0).then(|| self.max() as f64 / self.min() as f64)
    }
}

pub async fn measure(url: &str, tasks: usize, window: Duration) -> PerLib<Contention> {
    let mut out = PerLib::<Contention>::default();
    for lib in Lib::ALL {
        *out.get_mut(lib) = one(url, lib, tasks, window).await;
    }
    out
}

async fn one(url: &str, lib: Lib, tasks: usize, window: Duration) -> Contention {
    let client = Arc::new(Client::connect(lib, url).await);
    client.cycle("contended:warm").await.expect("warm-up");
    let key = Arc::new(format!("contended:{}", lib.id()));
    let counting = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let per_task: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    let mut set = tokio::task::JoinSet::new();
    for me in 0..tasks {
        let (client, key, counting, last) =
            (client.clone(), key.clone(), counting.clone(), last.clone());
        let (handoffs, errors, per_task) = (handoffs.clone(), errors.clone(), per_task.clone());
        set.spawn(async move {
            loop {
                match client.acquire(&key, TTL, Duration::from_secs(60)).await {
                    Ok(held) => {
                        let previous = last.swap(me, Ordering::SeqCst);
                        if counting.load(Ordering::SeqCst) {
                            per_task[me].fetch_add(1, Ordering::Relaxed);
                            if previous != me {
                                handoffs.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if held.release().await.is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    tokio::time::sleep(WARM_UP).await;
    counting.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    counting.store(false, Ordering::SeqCst);
    let secs = started.elapsed().as_secs_f64();
    set.abort_all();
    while set.join_next().await.is_some() {}
    Contention {
        secs,
        per_task: per_task.iter().map(|n| n.load(Ordering::Relaxed)).collect(),
        handoffs: handoffs.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    }
}
