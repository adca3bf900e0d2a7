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
    let held_fence = held.fence();
    assert!(held_fence.is_some());
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
    assert!(next.fence() > held_fence);
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

#[tokio::test(start_paused = true)]
async fn an_unused_fencing_counter_expires_a_day_after_its_lease_and_tokens_still_increase() {
    let (_, regs) = replicas(2);
    let ttl = Duration::from_secs(90);
    let first = regs[0]
        .lock("invoice:1")
        .fencing(true)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let token = first.fence().unwrap();
    first.release().await.unwrap();
    assert_eq!(
        regs[1].inspect("invoice:1").await.unwrap().fence,
        Some(token)
    );
    tokio::time::advance(Duration::from_secs(24 * 3600) + ttl - Duration::from_secs(1)).await;
    assert_eq!(
        regs[1].inspect("invoice:1").await.unwrap().fence,
        Some(token),
        "kept a day beyond the lease"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        regs[1].inspect("invoice:1").await.unwrap().fence,
        None,
        "the counter is gone: memory stays bounded"
    );
    let next = regs[1]
        .lock("invoice:1")
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    assert!(next.fence().unwrap() > token);
}

/// Regression: a waiter's acquisition, dropped after its runtime was gone, let go of its queue
/// place with `tokio::spawn`, which panics outside a runtime.
#[test]
fn an_in_memory_waiter_dropped_outside_any_runtime_leaves_the_queue_without_panicking() {
    use futures_util::FutureExt;
    let (_, regs) = replicas(2);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let (held, waiting) = first.block_on(async {
        let held = regs[0].lock("job").acquire().await.unwrap();
        let mut waiting = Box::pin(regs[1].lock("job").wait(Duration::from_secs(60)).acquire());
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "queued behind the holder"
        );
        (held, waiting)
    });
    drop(first);
    drop(waiting);
    runtime().block_on(async {
        held.release().await.unwrap();
        let info = regs[1].inspect("job").await.unwrap();
        assert_eq!(
            info.owner, None,
            "the waiter that was dropped left the queue: the lock was not handed to it"
        );
    });
}
