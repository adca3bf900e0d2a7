//! Semaphores (`permits`): N holders at once across registries, each with a lease of its own.

use std::time::Duration;

use lock_runtime::{LockError, Permits, Registry};
use lock_tests::RedisServer;

use super::support::{on_redis_and_memory, registry};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_in_several_registries_never_exceed_the_permits() {
    let server = RedisServer::start();
    let registries: Vec<_> = (0..4).map(|_| registry(&server)).collect();
    let most = lock_tests::most_inside(&registries, "gpus", Some(3), 12, 10).await;
    assert!(most <= 3, "{most} holders at once with 3 permits");
    assert!(
        most >= 2,
        "permits were never held side by side ({most} at most)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_name_different_permits_for_one_key_are_refused_and_told_why() {
    on_redis_and_memory(|a, b| async move {
        let held = a.lock("pool").permits(3).acquire().await.unwrap();
        let err = b.lock("pool").permits(2).acquire().await.unwrap_err();
        let LockError::InvalidOptions { key, reason } = &err else {
            panic!("a mismatch is an error, not a wait: {err:?}");
        };
        assert_eq!(key, "pool");
        assert!(
            reason.contains("semaphore of 3 permits") && reason.contains("2 permits"),
            "{reason}"
        );
        // Nothing was taken or changed by the refused call.
        let info = b.inspect("pool").await.unwrap();
        assert_eq!(info.permits, Some(Permits { held: 1, total: 3 }));
        held.release().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_lock_and_permits_on_one_key_exclude_each_other() {
    on_redis_and_memory(|a, b| async move {
        let exclusive = a.lock("mixed").acquire().await.unwrap();
        let err = b.lock("mixed").permits(2).acquire().await.unwrap_err();
        assert!(err.is_busy(), "a permit waits for the lock: {err:?}");
        exclusive.release().await.unwrap();
        let permit = b.lock("mixed").permits(2).acquire().await.unwrap();
        let err = a.lock("mixed").acquire().await.unwrap_err();
        assert!(err.is_busy(), "the lock waits for every permit: {err:?}");
        permit.release().await.unwrap();
    })
    .await;
}

/// An exclusive waiter stops new permit takers, even with permits free, so a stream of them
/// cannot starve it; the last permit's release hands it the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_exclusive_waiter_goes_before_later_permit_takers() {
    on_redis_and_memory(|a, b| async move {
        let permit = a.lock("pool").permits(2).acquire().await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.lock("pool").wait(Duration::from_secs(20)).acquire().await }
        });
        lock_tests::eventually(Duration::from_secs(10), "the waiter queued", || async {
            a.lock("pool").permits(2).acquire().await.is_err()
        })
        .await;
        permit.release().await.unwrap();
        let exclusive = waiter.await.unwrap().expect("handed the lock");
        let info = a.inspect("pool").await.unwrap();
        assert_eq!(info.owner.as_deref(), Some(exclusive.token()));
        exclusive.release().await.unwrap();
        let permit = a.lock("pool").permits(2).acquire().await;
        permit
            .expect("permits are free again")
            .release()
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_permit_is_renewed_while_held_and_stays_counted() {
    on_redis_and_memory(|a, b| async move {
        let guard = a
            .lock("renewed")
            .permits(2)
            .ttl(lock_tests::RENEWED_TTL)
            .acquire()
            .await
            .unwrap();
        // Three ttls: held only if the keeper renewed it.
        for _ in 0..3 {
            tokio::time::sleep(lock_tests::RENEWED_TTL).await;
            assert!(!guard.is_lost(), "renewed in time");
            let info = b.inspect("renewed").await.unwrap();
            assert_eq!(info.permits, Some(Permits { held: 1, total: 2 }));
        }
        guard.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_crashed_holders_permit_comes_back_within_its_ttl() {
    let server = RedisServer::start();
    let bin = env!("CARGO_BIN_EXE_lock-holder");
    let mut holder = lock_tests::start_holder(bin, &server.url(), "pool", 1000, Some(1));
    holder.kill().unwrap();
    holder.wait().unwrap();

    let reg = registry(&server);
    let err = reg.lock("pool").permits(1).acquire().await.unwrap_err();
    let LockError::Busy {
        retry_after: Some(left),
        ..
    } = err
    else {
        panic!("the dead holder's permit is still counted at first: {err:?}");
    };
    assert!(
        left <= Duration::from_millis(1000),
        "bounded by its ttl: {left:?}"
    );
    let _held = reg
        .lock("pool")
        .permits(1)
        .wait(Duration::from_millis(1000) + Duration::from_secs(2))
        .acquire()
        .await
        .expect("the permit came back within the ttl");
}

#[tokio::test]
async fn bad_permits_are_refused_before_anything_is_sent() {
    let registry = Registry::in_memory();
    let err = registry.lock("k").permits(0).acquire().await.unwrap_err();
    assert!(
        matches!(&err, LockError::InvalidOptions { reason, .. } if reason.contains("at least 1")),
        "{err:?}"
    );
    let err = registry
        .lock("k")
        .permits(2)
        .fencing(true)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::InvalidOptions { reason, .. } if reason.contains("fencing")),
        "{err:?}"
    );
}

/// A permit taken away (here by an operator's force-unlock) is lost at the holder's next
/// renewal, and `on_lost = "cancel"` stops its body; so is a reader's place.
#[tokio::test]
async fn a_permit_or_a_read_lock_taken_away_stops_its_body() {
    on_redis_and_memory(|a, b| async move {
        let ttl = lock_tests::RENEWED_TTL;
        for (key, request) in [
            ("pool", a.lock("pool").permits(2)),
            ("catalog", a.lock("catalog").mode(lock_runtime::Mode::Read)),
        ] {
            let body = lock_tests::spawn_hung_body(request.ttl(ttl)).await;
            assert!(b.force_unlock(key).await.unwrap(), "{key} was held");
            let err = body.await.unwrap().unwrap_err();
            lock_tests::assert_lost(&err, lock_runtime::LostReason::Gone);
        }
    })
    .await;
}

/// A permit whose place ran out on the server (its score, the place's deadline, passed) is lost
/// at the next renewal, not renewed back to life: in between, another taker may have been
/// counted without it.
#[tokio::test]
async fn a_permit_whose_place_ran_out_on_the_server_is_lost_not_renewed() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = lock_tests::raw(&server.url()).await;
    let guard = reg
        .lock("lapsed")
        .permits(2)
        .ttl(lock_tests::RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    // The place's deadline, long past: as if its holder had not renewed it in time.
    let updated: i64 = redis::cmd("ZADD")
        .arg("lock:lapsed")
        .arg("XX")
        .arg("CH")
        .arg(1)
        .arg(guard.token())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(updated, 1, "the place was where it is documented");
    let err = tokio::time::timeout(lock_tests::RENEWED_TTL * 3, guard.lost())
        .await
        .expect("the next renewal finds the place ran out");
    lock_tests::assert_lost(&err, lock_runtime::LostReason::Gone);
}
