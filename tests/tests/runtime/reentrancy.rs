use lock_runtime::LockError;
use lock_tests::RedisServer;

use super::support::registry;

#[tokio::test]
async fn nested_locking_of_the_same_key_in_one_task_reenters() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let inner_reg = reg.clone();
    let out = reg
        .lock("nested")
        .fencing(true)
        .run(async move {
            let outer = lock_runtime::current().unwrap();
            let inner = inner_reg
                .lock("nested")
                .run(async {
                    let inner = lock_runtime::current().unwrap();
                    Ok::<_, LockError>((inner.token().to_owned(), inner.fence()))
                })
                .await?;
            assert_eq!(inner.0, outer.token(), "the same lease, not a second lock");
            assert_eq!(inner.1, outer.fence());
            let guard = inner_reg.lock("nested").acquire().await?;
            assert!(guard.is_reentrant());
            guard.release().await?; // does nothing: the outer holder releases
            assert!(!outer.is_lost());
            Ok::<_, LockError>(outer.fence())
        })
        .await
        .unwrap();
    assert!(out.is_some(), "the outer lock's fencing token");
    assert!(
        reg.inspect("nested").await.unwrap().owner.is_none(),
        "released once, at the end"
    );
}

/// A nested request that asks for a fencing token inside a lock taken without one: re-entering
/// would hand it a guard whose `fence()` is `None`, and a caller that skips the fenced write
/// when there is no token would write unguarded. Refused, naming the key and the fix (found by
/// an attack on reentrancy).
#[tokio::test]
async fn a_nested_request_for_fencing_inside_an_unfenced_lock_is_refused() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let inner_reg = reg.clone();
    let err = reg
        .lock("unfenced")
        .run(async move {
            inner_reg
                .lock("unfenced")
                .fencing(true)
                .acquire()
                .await
                .map(|guard| guard.fence())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::InvalidOptions { key, reason }
            if key == "unfenced" && reason.contains("fencing")),
        "{err:?}"
    );
    // The other way round re-enters: a fenced lock serves a request that does not need it.
    let inner_reg = reg.clone();
    let fence = reg
        .lock("fenced")
        .fencing(true)
        .run(async move {
            let guard = inner_reg.lock("fenced").acquire().await?;
            Ok::<_, LockError>(guard.fence())
        })
        .await
        .unwrap();
    assert!(fence.is_some());
}

#[tokio::test]
async fn a_spawned_task_does_not_inherit_the_lock() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let inner_reg = reg.clone();
    reg.lock("not-inherited")
        .run(async move {
            let err =
                tokio::spawn(
                    async move { inner_reg.lock("not-inherited").acquire().await.map(|_| ()) },
                )
                .await
                .unwrap()
                .unwrap_err();
            assert!(err.is_busy(), "another task is another holder: {err:?}");
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn current_names_the_innermost_of_nested_different_keys() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let r2 = reg.clone();
    reg.lock("outer")
        .run(async move {
            assert_eq!(lock_runtime::current().unwrap().key(), "outer");
            r2.lock("inner")
                .run(async {
                    assert_eq!(lock_runtime::current().unwrap().key(), "inner");
                    assert_eq!(lock_runtime::current().unwrap().redis_key(), "lock:inner");
                    Ok::<_, LockError>(())
                })
                .await?;
            assert_eq!(lock_runtime::current().unwrap().key(), "outer");
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
    assert!(lock_runtime::current().is_none());
}

/// A task whose lease was lost (its outer body runs on under `on_lost = "continue"`) does not
/// re-enter it: a nested request for the key, now held by another client, is not granted the
/// lost lease, so a nested `on_lost = "cancel"` body never runs without the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_request_does_not_reenter_a_lease_already_lost() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let other = registry(&server);
    let inner_reg = reg.clone();
    let outcome = reg
        .lock("nested:lost")
        .ttl(std::time::Duration::from_secs(3))
        .on_lost(lock_runtime::OnLost::Continue)
        .run(async move {
            let outer = lock_runtime::current().unwrap();
            assert!(other.force_unlock("nested:lost").await?);
            let thief = other.lock("nested:lost").acquire().await?;
            tokio::time::timeout(std::time::Duration::from_secs(20), outer.lost())
                .await
                .expect("the outer lease is found lost at its next renewal");
            let nested = inner_reg.lock("nested:lost").acquire().await;
            let inner_ran = inner_reg
                .lock("nested:lost")
                .run(async { Ok::<_, LockError>(()) })
                .await;
            thief.release().await?;
            Ok::<_, LockError>((nested.map(|g| g.is_reentrant()), inner_ran))
        })
        .await
        .unwrap();
    let (nested, inner_ran) = outcome;
    assert!(
        nested.is_err() && inner_ran.is_err(),
        "another client holds the key, yet a nested acquire gave {nested:?} and a nested \
         cancel body ran to {inner_ran:?}"
    );
}
