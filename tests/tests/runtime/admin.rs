use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LostReason};
use lock_tests::RedisServer;
use redis::AsyncCommands;

use super::support::{assert_lost, raw, registry, spawn_hung_body};

#[tokio::test]
async fn inspect_shows_owner_remaining_lease_and_fence() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let free = reg.inspect("job").await.unwrap();
    assert_eq!((free.owner, free.remaining, free.fence), (None, None, None));
    let guard = reg
        .lock("job")
        .fencing(true)
        .ttl(Duration::from_secs(40))
        .acquire()
        .await
        .unwrap();
    let info = reg.inspect("job").await.unwrap();
    assert_eq!(info.owner.as_deref(), Some(guard.token()));
    assert!(info.fence.is_some());
    assert_eq!(info.fence, guard.fence());
    assert!(info.remaining.unwrap() > Duration::from_secs(30));
    let held = reg.held();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].key.as_str(), held[0].fence, held[0].lost),
        ("job", guard.fence(), false)
    );
    guard.release().await.unwrap();
    assert!(reg.held().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_frees_the_key_wakes_waiters_and_the_holder_learns_it_lost() {
    let server = RedisServer::start();
    let (holder, waiter, admin) = (registry(&server), registry(&server), registry(&server));
    let guard = holder
        .lock("stuck")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("stuck")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    assert!(admin.force_unlock("stuck").await.unwrap());
    let taken = waiting.await.unwrap().expect("woken by the force-unlock");
    let err = guard.lost().await;
    // `Stolen` when the waiter took the key before the holder's next renewal, `Gone` when the
    // renewal came first: both are what happened.
    assert!(
        matches!(
            err,
            lock_runtime::LockError::Lost {
                reason: LostReason::Stolen | LostReason::Gone,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        admin.inspect("stuck").await.unwrap().owner.as_deref(),
        Some(taken.token()),
        "the old holder's renewals never touched the new holder's lock"
    );
}

#[tokio::test]
async fn shutdown_releases_every_held_lock_and_stops_guarded_bodies() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let a = reg.lock("a").acquire().await.unwrap();
    let b = reg.lock("b").acquire().await.unwrap();
    let body = spawn_hung_body(reg.clone().lock("c")).await;
    assert_eq!(reg.held().len(), 3);
    assert_eq!(reg.shutdown().await, 3);
    let err = body.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::Shutdown);
    for key in ["a", "b", "c"] {
        assert!(
            reg.inspect(key).await.unwrap().owner.is_none(),
            "{key} released"
        );
    }
    assert!(a.is_lost() && b.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_many_locks_and_the_registry_and_its_clones_take_no_new_ones() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let clone = reg.clone();
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(reg.lock(format!("many:{i}")).acquire().await.unwrap());
    }
    assert_eq!(reg.shutdown().await, 200);
    assert!(reg.held().is_empty());
    let mut con = raw(&server.url()).await;
    let left: Vec<String> = con.keys("lock:many:*").await.unwrap();
    assert!(left.is_empty(), "still on the server: {left:?}");
    assert!(guards.iter().all(LockGuard::is_lost));

    for registry in [&reg, &clone] {
        let err = registry.lock("after").acquire().await.unwrap_err();
        assert_shut_down(&err);
        let err = registry
            .lock("after")
            .run(async { Ok::<_, LockError>(()) })
            .await
            .unwrap_err();
        assert_shut_down(&err);
    }
    let exists: bool = con.exists("lock:after").await.unwrap();
    assert!(!exists, "nothing was taken on the server");
    // Reading stays possible, and shutting down again has nothing left to do.
    assert_eq!(reg.inspect("after").await.unwrap().owner, None);
    assert_eq!(clone.shutdown().await, 0);
}

fn assert_shut_down(err: &LockError) {
    let message = err.to_string();
    assert!(
        matches!(err, LockError::ShutDown { key } if key == "after")
            && message.contains("`after`")
            && message.contains("shut down")
            && message.contains("new registry"),
        "says the registry was shut down and what to do: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_within_its_bound_while_redis_does_not_answer() {
    let server = RedisServer::start();
    // 1 s to connect and per command: one release after another would take 200 s here.
    let reg = registry(&server);
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(
            reg.lock(format!("silent:{i}"))
                .ttl(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap(),
        );
    }
    server.pause();
    // A liveness guard, not a speed assertion: the bound is the registry's timeouts (2 s).
    let released = tokio::time::timeout(Duration::from_secs(60), reg.shutdown())
        .await
        .expect("shutdown returned");
    server.resume();
    assert_eq!(released, 0, "Redis answered nothing");
    assert!(reg.held().is_empty(), "the process no longer lists them");
    assert!(guards.iter().all(LockGuard::is_lost));
}

#[tokio::test]
async fn an_owner_checked_force_unlock_spares_a_lock_that_changed_hands() {
    let server = RedisServer::start();
    let (holder, admin) = (registry(&server), registry(&server));
    let first = holder.lock("handed-over").acquire().await.unwrap();
    let seen = admin.inspect("handed-over").await.unwrap().owner.unwrap();
    first.release().await.unwrap();
    let second = holder.lock("handed-over").acquire().await.unwrap();
    assert!(!admin
        .force_unlock_owned_by("handed-over", &seen)
        .await
        .unwrap());
    assert!(!second.is_lost());
    assert_eq!(
        admin.inspect("handed-over").await.unwrap().owner.as_deref(),
        Some(second.token())
    );
    assert!(admin
        .force_unlock_owned_by("handed-over", second.token())
        .await
        .unwrap());
    assert!(admin.inspect("handed-over").await.unwrap().owner.is_none());
}
