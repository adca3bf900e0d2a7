//! Two quick figures, measured side by side in one run on a throwaway redis-server:
//! the uncontended acquire+release cycle against two PING round trips, and the handoff from a
//! release to a blocked waiter holding the lock.
//!
//! `cargo run --release -p lock-examples --example quick_figures`

use std::time::{Duration, Instant};

use lock_runtime::Registry;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let server = lock_tests::RedisServer::start();
    let client = server.client();
    let mut ping = client.get_connection_manager().await.unwrap();
    let a = Registry::from_url(&server.url()).unwrap();
    let b = Registry::from_url(&server.url()).unwrap();
    // Warm up connections and scripts.
    for _ in 0..200 {
        let _: String = redis::cmd("PING").query_async(&mut ping).await.unwrap();
        a.lock("warm")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    const N: usize = 5000;
    let (mut rtt, mut cycle) = (Vec::with_capacity(N), Vec::with_capacity(N));
    // Interleaved, so both see the same machine state.
    for _ in 0..N {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut ping).await.unwrap();
        rtt.push(t.elapsed());
        let t = Instant::now();
        let g = a.lock("cycle").acquire().await.unwrap();
        g.release().await.unwrap();
        cycle.push(t.elapsed());
    }
    let (rtt, cycle) = (median(rtt), median(cycle));

    let mut handoff = Vec::new();
    for _ in 0..300 {
        let held = a.lock("handoff").acquire().await.unwrap();
        let waiter_reg = b.clone();
        let (parked_tx, parked) = tokio::sync::oneshot::channel::<()>();
        let waiter = tokio::spawn(async move {
            drop(parked_tx);
            let g = waiter_reg
                .lock("handoff")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        let _ = parked.await;
        // Let the waiter fail its attempts and park on the subscription.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        held.release().await.unwrap();
        let acquired_at = waiter.await.unwrap();
        handoff.push(acquired_at - t);
    }
    let handoff = median(handoff);

    println!("| figure | median | ratio |");
    println!("|---|---|---|");
    println!("| PING round trip (RTT) | {rtt:?} | 1.00 x RTT |");
    println!(
        "| uncontended acquire+release | {cycle:?} | {:.2} x (2 x RTT) |",
        cycle.as_secs_f64() / (2.0 * rtt.as_secs_f64())
    );
    println!(
        "| handoff: release start -> waiter holds | {handoff:?} | {:.2} x RTT |",
        handoff.as_secs_f64() / rtt.as_secs_f64()
    );
}
