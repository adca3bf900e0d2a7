//! `--postgres`: lock-runtime's Postgres store beside Postgres's own advisory locks by hand
//! (`pg_try_advisory_lock` / `pg_advisory_unlock`, and the blocking `pg_advisory_lock` for a
//! hand-over) on the same kind of connection (one tokio-postgres client, statements pipelined
//! by concurrent tasks), against one throwaway cluster, side by side in one run.
//!
//! What the two buy is not the same: an advisory lock is a session's, with no lease, no
//! fencing, no queue, gone on a failover, and not usable through PgBouncer's transaction mode;
//! the store's lock is a leased row. The ratios say what those promises cost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::Registry;
use lock_tests::postgres::PostgresServer;

use crate::stats::{dur, num, Samples};

async fn client(url: &str) -> Arc<tokio_postgres::Client> {
    Arc::new(lock_tests::postgres::connect(url).await)
}

fn registry(url: &str) -> Registry {
    Registry::builder()
        .postgres(url)
        .build()
        .expect("a Postgres registry")
}

async fn try_advisory(c: &tokio_postgres::Client, id: i64) -> bool {
    c.query_one("SELECT pg_try_advisory_lock($1)", &[&id])
        .await
        .expect("pg_try_advisory_lock")
        .get(0)
}

async fn advisory_unlock(c: &tokio_postgres::Client, id: i64) {
    let _: bool = c
        .query_one("SELECT pg_advisory_unlock($1)", &[&id])
        .await
        .expect("pg_advisory_unlock")
        .get(0);
}

/// Lock and unlock one free key, `n` times in a row: ours, then by hand.
async fn cycles(url: &str, n: usize) -> (Samples, Samples) {
    let ours = registry(url);
    let by_hand = client(url).await;
    let ours_cycle = || async {
        ours.lock("cycle")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    };
    let hand_cycle = || async {
        assert!(try_advisory(&by_hand, 1).await);
        advisory_unlock(&by_hand, 1).await;
    };
    // Connections made, schema created, statements warm.
    for _ in 0..50 {
        ours_cycle().await;
        hand_cycle().await;
    }
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        ours_cycle().await;
        a.push(t.elapsed());
        let t = Instant::now();
        hand_cycle().await;
        b.push(t.elapsed());
    }
    (Samples::new(a), Samples::new(b))
}

/// From the holder's release to the waiter holding the lock, `n` times: ours (a queued waiter
/// woken by `NOTIFY`, the lock handed over in the release), then a blocked `pg_advisory_lock`.
async fn handoffs(url: &str, n: usize) -> (Samples, Samples) {
    let (holder, waiter) = (registry(url), registry(url));
    let mut ours = Vec::with_capacity(n);
    for _ in 0..n {
        let held = holder.lock("handoff").acquire().await.unwrap();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                let guard = waiter
                    .lock("handoff")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await;
                (guard.unwrap(), Instant::now())
            }
        });
        // Until the waiter is queued (and so listening: it queues on its first busy attempt,
        // then listens before the next).
        while holder.inspect("handoff").await.unwrap().waiters == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (guard, got) = waiting.await.unwrap();
        ours.push(got - released);
        guard.release().await.unwrap();
    }
    let (holder, waiter) = (client(url).await, client(url).await);
    let mut by_hand = Vec::with_capacity(n);
    for _ in 0..n {
        assert!(try_advisory(&holder, 2).await);
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .execute("SELECT pg_advisory_lock(2)", &[])
                    .await
                    .unwrap();
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        advisory_unlock(&holder, 2).await;
        let got = waiting.await.unwrap();
        by_hand.push(got - released);
        advisory_unlock(&waiter, 2).await;
    }
    (Samples::new(ours), Samples::new(by_hand))
}

/// Lock cycles a second with `tasks` tasks, each on a key of its own, for `window` (after a
/// quarter of it to settle): ours, then by hand on one pipelined client.
async fn throughput(url: &str, tasks: usize, window: Duration) -> (f64, f64) {
    let ours = registry(url);
    let ours_rate = rate(tasks, window, move |t| {
        let (ours, key) = (ours.clone(), format!("tp:{t}"));
        async move {
            match ours.lock(&key).acquire().await {
                Ok(guard) => guard.release().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
    let by_hand = client(url).await;
    let hand_rate = rate(tasks, window, move |t| {
        let (c, id) = (by_hand.clone(), 1000 + t as i64);
        async move {
            let taken = try_advisory(&c, id).await;
            if taken {
                advisory_unlock(&c, id).await;
            }
            taken
        }
    })
    .await;
    (ours_rate, hand_rate)
}

/// Statements a second that one waiter sends while blocked behind a live holder (a 3 s lease,
/// renewed) for `window`, as the server's statement log counts them: ours (its attempts and its
/// `LISTEN`s; the holder's renewals are not counted), then a blocked `pg_advisory_lock` (one
/// statement, sent before the window, however long it waits).
async fn waiting_cost(server: &PostgresServer, window: Duration) -> (f64, f64) {
    let url = server.url();
    let (holder, waiter) = (registry(&url), registry(&url));
    let held = holder
        .lock("parked")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("parked")
            .wait(window * 4)
            .acquire()
            .await
            .unwrap()
    });
    while holder.inspect("parked").await.unwrap().waiters == 0 {
        tokio::task::yield_now().await;
    }
    let sent = || {
        server.statements_with("distributed_lock.acquire(")
            + server.statements_with("distributed_lock.listen(")
    };
    let before = sent();
    tokio::time::sleep(window).await;
    let ours = (sent() - before) as f64 / window.as_secs_f64();
    held.release().await.unwrap();
    waiting.await.unwrap().release().await.unwrap();

    let (holder, waiter) = (client(&url).await, client(&url).await);
    assert!(try_advisory(&holder, 3).await);
    // Unnamed, as the store's statements are: the log counts those.
    let blocked = tokio::spawn(async move {
        waiter
            .query_typed("SELECT pg_advisory_lock(3)", &[])
            .await
            .unwrap();
    });
    let advisory = || server.statements_with("pg_advisory_lock(3)");
    while advisory() == 0 {
        tokio::task::yield_now().await;
    }
    let before = advisory();
    tokio::time::sleep(window).await;
    let by_hand = (advisory() - before) as f64 / window.as_secs_f64();
    advisory_unlock(&holder, 3).await;
    blocked.await.unwrap();
    (ours, by_hand)
}

/// Cycles a second that `tasks` tasks complete, each calling `cycle(its number)` in a loop.
async fn rate<F, Fut>(tasks: usize, window: Duration, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (cycle, stop, done) = (cycle.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if cycle(t).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(window / 4).await;
    let start = done.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let rate = (done.load(Ordering::Relaxed) - start) as f64 / window.as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("a task");
    }
    rate
}

pub fn run(quick: bool) {
    let server = PostgresServer::start();
    // Its own server, which logs every statement: the logging would slow the others.
    let logging = PostgresServer::start_logging();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (n, handoffs_n, window, parked) = if quick {
        (300, 30, Duration::from_millis(500), Duration::from_secs(3))
    } else {
        (2000, 200, Duration::from_secs(2), Duration::from_secs(10))
    };
    runtime.block_on(async {
        println!(
            "Postgres {} (throwaway cluster, fsync off), one run:\n",
            server.psql("SHOW server_version")
        );
        println!("| | lock-runtime on Postgres | advisory lock by hand | ratio |");
        println!("|---|---|---|---|");
        let (ours, hand) = cycles(&url, n).await;
        println!(
            "| lock cycle, median ({n} cycles) | {} | {} | {:.2} |",
            dur(ours.median()),
            dur(hand.median()),
            ours.median().as_secs_f64() / hand.median().as_secs_f64()
        );
        println!(
            "| lock cycle, p99 | {} | {} | {:.2} |",
            dur(ours.quantile(0.99)),
            dur(hand.quantile(0.99)),
            ours.quantile(0.99).as_secs_f64() / hand.quantile(0.99).as_secs_f64()
        );
        let (ours, hand) = handoffs(&url, handoffs_n).await;
        println!(
            "| hand-over, release to next holder, median ({handoffs_n}) | {} | {} | {:.2} |",
            dur(ours.median()),
            dur(hand.median()),
            ours.median().as_secs_f64() / hand.median().as_secs_f64()
        );
        let (ours, hand) = waiting_cost(&logging, parked).await;
        println!(
            "| waiting cost: statements/s by one waiter behind a live holder (3 s lease, {} s) | {ours:.1} | {hand:.1} | |",
            parked.as_secs()
        );
        for tasks in [64, 1024] {
            let (ours, hand) = throughput(&url, tasks, window).await;
            println!(
                "| throughput, {tasks} tasks on keys of their own (cycles/s) | {} | {} | {:.2} |",
                num(ours),
                num(hand),
                ours / hand
            );
        }
    });
}
