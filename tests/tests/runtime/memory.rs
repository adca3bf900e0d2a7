//! The in-memory backend keeps the Redis semantics, on Tokio's (pausable) clock.

use std::time::Duration;

use lock_runtime::{LostReason, MemoryStore, Registry};

use super::support::assert_lost;

fn replicas(n: usize) -> (MemoryStore, Vec<Registry>) {
    let store = MemoryStore::new();
    let regs = (0..n)
        .map(|_| Registry::builder().memory(store.clone()).build().unwrap())
        .collect();
    (store, regs)
}

#[tokio::test(start_paused = true)]
async fn registries_sharing_a_store_exclude_each_other_and_hand_over_on_release() {
    let (_, regs) = replicas(2);
    let held = regs[0].lock("job").fencing(true).acquire().await.unwrap();
    assert!(regs[1].lock("job").acquire().await.unwrap_err().is_busy());
    let waiter = {
        let reg = regs[1].clone();
        tokio::spawn(async move {
            reg.lock("job")
                .fencing(true)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
        })
    };
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(next.fence(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_lock_expires_by_its_ttl_on_the_paused_clock() {
    let (_, regs) = replicas(2);
    let guard = regs[0]
        .lock("job")
        .ttl(Duration::from_secs(5))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(guard);
    let started = tokio::time::Instant::now();
    let _held = regs[1]
        .lock("job")
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // The waiter wakes 1 ms after the holder's remaining lease, when the key is gone.
    assert!(
        started.elapsed() <= Duration::from_millis(5_001),
        "free at the ttl: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn renewal_and_theft_detection_work_without_redis() {
    let (store, regs) = replicas(1);
    let reg = &regs[0];
    let guard = reg
        .lock("job")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!guard.is_lost(), "renewed past three ttls");
    store.overwrite("lock:job", "intruder");
    let err = guard.lost().await;
    assert_lost(&err, LostReason::Stolen);
}
