//! Multi-key locks (`lock_all`, `keys = [..]`): several keys taken all or none, in one step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LostReason, Mode};
use lock_tests::RedisServer;

use super::support::{on_redis_and_memory, registry};

/// Half the tasks name the keys one way round, half the other: sorted and taken in one step,
/// they never wait for each other in turn, and no key ever has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_naming_the_keys_in_opposite_orders_never_deadlock() {
    let server = RedisServer::start();
    let registries = [registry(&server), registry(&server)];
    let inside: Arc<[AtomicUsize; 3]> = Arc::default();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let reg = registries[i % 2].clone();
            let inside = inside.clone();
            // Pairs of three accounts, named in both orders.
            let (x, y) = [(0, 1), (1, 0), (1, 2), (2, 1)][i % 4];
            tokio::spawn(async move {
                for _ in 0..15 {
                    reg.lock_all([format!("account:{x}"), format!("account:{y}")])
                        .wait(Duration::from_secs(30))
                        .run(async {
                            for account in [x, y] {
                                let now = inside[account].fetch_add(1, Ordering::SeqCst);
                                assert_eq!(now, 0, "account {account} had another holder");
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            for account in [x, y] {
                                inside[account].fetch_sub(1, Ordering::SeqCst);
                            }
                            Ok::<_, LockError>(())
                        })
                        .await
                        .unwrap_or_else(|e| panic!("task {i}: {e}"));
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.expect("no key had two holders");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every task finished: nobody waited for anybody in turn");
}

/// One token above every earlier token of each key, and each key's later holders above it.
#[tokio::test]
async fn a_fencing_token_is_above_every_keys_earlier_tokens() {
    on_redis_and_memory(|a, _| async move {
        let fence = |key: &'static str| {
            let a = a.clone();
            async move {
                let guard = a.lock(key).fencing(true).acquire().await.unwrap();
                let fence = guard.fence().unwrap();
                guard.release().await.unwrap();
                fence
            }
        };
        let mut before = Vec::new();
        for key in ["account:1", "account:1", "account:1", "account:2"] {
            before.push(fence(key).await);
        }
        let both = a
            .lock_all(["account:1", "account:2"])
            .fencing(true)
            .acquire()
            .await
            .unwrap();
        let token = both.fence().expect("fencing was asked for");
        assert!(before.iter().all(|f| *f < token), "{before:?} then {token}");
        both.release().await.unwrap();
        for key in ["account:1", "account:2"] {
            let later = fence(key).await;
            assert!(later > token, "{key}: {later} after {token}");
        }
    })
    .await;
}

#[tokio::test]
async fn one_key_taken_away_loses_the_whole_lock() {
    on_redis_and_memory(|a, b| async move {
        let request = a
            .lock_all(["account:1", "account:2"])
            .ttl(lock_tests::RENEWED_TTL);
        let body = lock_tests::spawn_hung_body(request).await;
        assert!(b.force_unlock("account:2").await.unwrap());
        let err = body.await.unwrap().unwrap_err();
        lock_tests::assert_lost(&err, LostReason::Gone);
        let left = b.inspect("account:1").await.unwrap();
        assert_eq!(left.owner, None, "the rest was released with the body");
    })
    .await;
}

/// Inside a multi-key lock its keys re-enter, alone or together; new keys alone are taken as
/// usual; more keys together with held ones are refused (taking keys in turn deadlocks).
#[tokio::test]
async fn reentry_covers_the_held_keys_and_refuses_to_add_keys_to_them() {
    on_redis_and_memory(|a, _| async move {
        let inner = a.clone();
        a.lock_all(["account:1", "account:2"])
            .run(async move {
                let again = |keys: &[&str]| inner.lock_all(keys.to_vec()).acquire();
                let _one = again(&["account:2"]).await.expect("a held key re-enters");
                let _both = again(&["account:2", "account:1"])
                    .await
                    .expect("all held keys re-enter");
                let other = again(&["account:3"]).await.expect("another key alone");
                other.release().await?;
                let err = again(&["account:1", "account:3"]).await.unwrap_err();
                let LockError::InvalidOptions { reason, .. } = &err else {
                    panic!("adding keys to held ones is refused: {err:?}");
                };
                assert!(reason.contains("all in one request"), "{reason}");
                Ok::<_, LockError>(())
            })
            .await
            .unwrap();
        assert!(a.held().is_empty());
    })
    .await;
}

#[tokio::test]
async fn several_keys_as_readers_or_permits_are_refused() {
    let registry = lock_runtime::Registry::in_memory();
    for request in [
        registry.lock_all(["a", "b"]).mode(Mode::Read),
        registry.lock_all(["a", "b"]).permits(2),
    ] {
        let err = request.acquire().await.unwrap_err();
        assert!(
            matches!(&err, LockError::InvalidOptions { reason, .. } if reason.contains("several keys")),
            "{err:?}"
        );
    }
}

/// Regression: a release wakes one waiter per process. A multi-key waiter woken for a key
/// that then found another of its keys taken kept the wake to itself, and a waiter that could
/// use the freed key slept on until the old holder's lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_waiter_that_cannot_use_a_wake_passes_it_on() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let ttl = Duration::from_secs(60);
    let first = b.lock("account:a").ttl(ttl).acquire().await.unwrap();
    let _long = b.lock("account:b").ttl(ttl).acquire().await.unwrap();
    let wait = |keys: [&'static str; 2]| {
        let a = a.clone();
        tokio::spawn(async move {
            a.lock_all(keys)
                .ttl(ttl)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        })
    };
    // Both follow `account:a`; the first to park is the one its release wakes. Each parks
    // after two attempts (one script call each): before subscribing, and once subscribed.
    let mut con = lock_tests::connection(&server.url());
    let scripts = |con: &mut redis::Connection| {
        lock_tests::command_calls(con)
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    };
    let before = scripts(&mut con);
    let stuck = wait(["account:a", "account:b"]);
    lock_tests::eventually(Duration::from_secs(10), "the first waiter parked", || {
        std::future::ready(scripts(&mut lock_tests::connection(&server.url())) >= before + 2)
    })
    .await;
    let free = wait(["account:a", "account:c"]);
    lock_tests::eventually(Duration::from_secs(10), "the second waiter parked", || {
        std::future::ready(scripts(&mut lock_tests::connection(&server.url())) >= before + 4)
    })
    .await;
    first.release().await.unwrap();
    lock_tests::eventually(
        Duration::from_secs(10),
        "account:a and account:c taken",
        || async { a.inspect("account:c").await.unwrap().owner.is_some() },
    )
    .await;
    free.await.unwrap().unwrap().release().await.unwrap();
    stuck.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_more_keys_than_one_script_should_take_is_refused_naming_the_limit() {
    on_redis_and_memory(|a, _| async move {
        let keys = (0..=lock_runtime::MAX_KEYS_PER_LOCK).map(|i| format!("item:{i}"));
        let err = a.lock_all(keys).acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
        assert!(err.to_string().contains("at most 64 keys"), "{err}");
        let keys = (0..lock_runtime::MAX_KEYS_PER_LOCK).map(|i| format!("item:{i}"));
        a.lock_all(keys)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    })
    .await;
}
