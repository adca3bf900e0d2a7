//! (c) and (g) on their own: a stopped holder process frees the lock within ttl + bound, and
//! dropping or cancelling never blocks the runtime while Redis does not answer.

use std::time::{Duration, Instant};

use lock_runtime::LockError;
use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;
use redis::AsyncCommands;

use super::support::{eventually, raw, registry, signal, spawn_hung_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_process_frees_the_lock_within_its_ttl_plus_bound() {
    // (c) with a paused client: the stopped process cannot renew, so its key expires one ttl
    // after its last renewal, and a waiter is woken by the remaining lease it was told.
    const BOUND: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let ttl = Duration::from_millis(900);
    let bin = env!("CARGO_BIN_EXE_lock-holder");
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap();
    let mut holder = lock_tests::start_holder(bin, &server.url(), "k", ttl_ms, None);
    // Let at least one renewal happen first.
    tokio::time::sleep(ttl / 2).await;
    signal(holder.id(), "STOP");
    let stopped = Instant::now();
    let b = registry(&server.url());
    let guard = b
        .lock("k")
        .wait(ttl * 3)
        .acquire()
        .await
        .expect("the stopped holder's lock expires");
    let free_after = stopped.elapsed();
    assert!(free_after <= ttl + BOUND, "{free_after:?}");
    signal(holder.id(), "CONT");
    let _ = holder.kill();
    let _ = holder.wait();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn dropping_and_cancelling_return_at_once_while_redis_does_not_answer() {
    // (g) on a single-threaded runtime: anything that blocked on Redis here would block every
    // task. Under a black hole a blocking call would take at least the 500 ms command timeout.
    const BOUND: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    let guard = reg
        .lock("guard")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let mut future = Box::pin(
        reg.lock("future")
            .ttl(Duration::from_secs(30))
            .run(async move {
                started_tx.send(()).unwrap();
                std::future::pending::<Result<(), LockError>>().await
            }),
    );
    tokio::select! {
        _ = &mut future => panic!("the body never ends"),
        _ = started => {}
    }
    let task = spawn_hung_body(reg.lock("task").ttl(Duration::from_secs(30))).await;
    // A registry of its own, whose last handle goes: its lock's release, its keeper, its
    // connections and its runtime's tasks all go with it.
    let other = registry(&proxy.url());
    let others = other
        .lock("other")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    proxy.blackhole();
    let t = Instant::now();
    drop(guard);
    assert!(
        t.elapsed() < BOUND,
        "dropping a guard blocked: {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    drop(future);
    assert!(
        t.elapsed() < BOUND,
        "dropping a guarded future blocked: {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(
        t.elapsed() < BOUND,
        "cancelling a task blocked: {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    drop(others);
    drop(other);
    assert!(
        t.elapsed() < BOUND,
        "dropping a registry's last handle blocked: {:?}",
        t.elapsed()
    );
    // The releases are finished in the background once Redis answers again.
    proxy.heal();
    let con = raw(&server.url()).await;
    eventually(
        Duration::from_secs(10),
        "the dropped locks were released",
        || {
            let mut con = con.clone();
            async move {
                let keys: Vec<String> = con.keys("lock:*").await.unwrap();
                keys.is_empty()
            }
        },
    )
    .await;
    // The keys go before the releasing task has read the replies; its bookkeeping follows.
    eventually(
        Duration::from_secs(10),
        "the released leases are forgotten",
        || std::future::ready(reg.held().is_empty()),
    )
    .await;
}
