//! Over on this side means over for every clone: a term or lock that ends here (resigned, its
//! work or body returned, its guard released or dropped, its registry shut down) is seen ended
//! by every `Term` and `CurrentLock` clone before the next holder can be let in, and a shutdown
//! lets the key go only once the body it guarded is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use lock_runtime::{current, CurrentLock, Leadership, LockError, LostReason, Registry, Term};

use super::support::{eventually, on_redis_and_memory};

/// Bounds every wait for an event.
const LIMIT: Duration = Duration::from_secs(20);
/// A lease no test waits out: a clone that still looks held after its end would look held for
/// a minute, not until the test looks.
const LONG: Duration = Duration::from_secs(60);

/// `term` is over now: `is_lost`, and `lost()` resolved without waiting.
fn assert_term_over(term: &Term, why: &str) {
    assert!(
        term.is_lost(),
        "{why}: a clone of the term still looks held"
    );
    let lost = term.lost().now_or_never();
    assert!(
        matches!(lost, Some(LockError::Lost { .. })),
        "{why}: a clone's lost() does not resolve: {lost:?}"
    );
}

fn assert_lock_over(lock: &CurrentLock, why: &str) {
    assert!(
        lock.is_lost(),
        "{why}: a clone of current() still looks held"
    );
    let lost = lock.lost().now_or_never();
    assert!(
        matches!(lost, Some(LockError::Lost { .. })),
        "{why}: a clone's lost() does not resolve: {lost:?}"
    );
}

/// `registry`'s candidate `a`, elected alone for a long lease.
async fn elected(registry: &Registry, key: &str) -> Leadership {
    registry
        .election(key)
        .identity("a")
        .ttl(LONG)
        .campaign()
        .await
        .expect("elected alone")
}

/// The next candidate is elected only after every clone of the resigned term is over: a task
/// the old leader spawned with a clone stops before the new leader starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigned_terms_clones_are_over_before_the_next_leader_is_elected() {
    on_redis_and_memory(|a, b| async move {
        let leadership = elected(&a, "ending:resign").await;
        let clone = leadership.of_term();
        let next = tokio::spawn({
            let candidate = b.election("ending:resign").identity("b").ttl(LONG);
            let clone = clone.clone();
            async move {
                let next = candidate.campaign().await.expect("elected");
                // Looked at the moment b leads, before anything else runs on this task.
                (clone.is_lost(), next)
            }
        });
        eventually(LIMIT, "b queued", || async {
            b.inspect("ending:resign").await.unwrap().waiters == 1
        })
        .await;
        leadership.resign().await.expect("resign");
        assert_term_over(&clone, "after resign");
        let (old_over_when_b_led, next) = tokio::time::timeout(LIMIT, next)
            .await
            .expect("handed over")
            .expect("task");
        assert!(
            old_over_when_b_led,
            "b led while a's term still looked held"
        );
        next.resign().await.expect("resign");
    })
    .await;
}

/// A term run by hand whose work returns is over for the clone its work handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terms_clones_are_over_once_its_work_returned() {
    on_redis_and_memory(|a, _b| async move {
        let leadership = elected(&a, "ending:run").await;
        let clone = leadership.of_term();
        leadership
            .run(async { Ok::<_, LockError>(()) })
            .await
            .expect("the work returns");
        assert_term_over(&clone, "after the work returned");
    })
    .await;
}

/// `lead`'s work hands a clone of its term to a task; when the work returns, the clone is over
/// before `lead` campaigns again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_ends_a_terms_clones_when_its_work_returns() {
    on_redis_and_memory(|a, _b| async move {
        let (clones_tx, mut clones) = tokio::sync::mpsc::unbounded_channel();
        let election = a
            .election("ending:lead")
            .identity("a")
            .ttl(LONG)
            .pause(LONG);
        let leading = tokio::spawn(async move {
            election
                .lead(|term| {
                    let clones = clones_tx.clone();
                    async move {
                        clones.send(term).expect("the test listens");
                        Ok::<_, LockError>(())
                    }
                })
                .await
        });
        let clone = tokio::time::timeout(LIMIT, clones.recv())
            .await
            .expect("a term begins")
            .expect("lead runs");
        eventually(LIMIT, "the first term resigned", || async {
            a.election("ending:lead").leader().await.unwrap().is_none()
        })
        .await;
        assert_term_over(&clone, "after the work returned");
        leading.abort();
    })
    .await;
}

/// A body's `current()` handed to a spawned task is over once the body returned, and once the
/// guarded future was dropped (before its background release), as well as after a release by
/// hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_current_clones_are_over_once_its_body_ended() {
    on_redis_and_memory(|a, _b| async move {
        let clone = a
            .lock("ending:body")
            .ttl(LONG)
            .run(async { Ok::<_, LockError>(current().expect("inside the body")) })
            .await
            .expect("the body returns");
        assert_lock_over(&clone, "after the body returned");

        let (clone_tx, clone_rx) = tokio::sync::oneshot::channel();
        let body = tokio::spawn({
            let a = a.clone();
            async move {
                a.lock("ending:dropped")
                    .ttl(LONG)
                    .run(async move {
                        clone_tx.send(current().expect("inside")).expect("listens");
                        std::future::pending::<Result<(), LockError>>().await
                    })
                    .await
            }
        });
        let clone = tokio::time::timeout(LIMIT, clone_rx)
            .await
            .expect("the body runs")
            .expect("sent");
        assert!(!clone.is_lost(), "held while the body runs");
        body.abort();
        assert!(body.await.expect_err("aborted").is_cancelled());
        assert_lock_over(&clone, "after the guarded future was dropped");
    })
    .await;
}

/// A shutdown lets a key go only once the body it guarded is gone: a body that does not yield
/// (blocking its thread) keeps the key until it ends, and the next holder never overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_a_key_only_after_the_body_it_guarded_was_dropped() {
    on_redis_and_memory(|a, b| async move {
        let (clone_tx, clone_rx) = tokio::sync::oneshot::channel();
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let body_ended = Arc::new(AtomicBool::new(false));
        let body = tokio::spawn({
            let (a, body_ended) = (a.clone(), body_ended.clone());
            async move {
                a.lock("ending:shutdown")
                    .ttl(LONG)
                    .run(async move {
                        clone_tx.send(current().expect("inside")).expect("listens");
                        // Work that does not yield: its thread is busy until the test says.
                        blocked.recv().expect("the test unblocks the body");
                        body_ended.store(true, Ordering::SeqCst);
                        std::future::pending::<Result<(), LockError>>().await
                    })
                    .await
            }
        });
        let clone = tokio::time::timeout(LIMIT, clone_rx)
            .await
            .expect("the body runs")
            .expect("sent");
        let mut next = tokio::spawn({
            let (b, body_ended) = (b.clone(), body_ended.clone());
            async move {
                let guard = b.lock("ending:shutdown").wait(LONG).acquire().await;
                // Looked at the moment the next holder has the key.
                (body_ended.load(Ordering::SeqCst), guard)
            }
        });
        eventually(LIMIT, "the next holder queued", || async {
            b.inspect("ending:shutdown").await.unwrap().waiters == 1
        })
        .await;
        let shutdown = tokio::spawn({
            let a = a.clone();
            async move { a.shutdown().await }
        });
        eventually(LIMIT, "the shutdown began", || async { clone.is_lost() }).await;
        // The next holder must not get the key while the body still runs: a release sent at
        // the shutdown would hand it over within milliseconds; a second shows it.
        let early = tokio::time::timeout(Duration::from_secs(1), &mut next).await;
        assert!(
            early.is_err(),
            "the next holder took the key while the shut-down body still ran"
        );
        unblock.send(()).expect("the body listens");
        let (body_had_ended, guard) = tokio::time::timeout(LIMIT, next)
            .await
            .expect("the key is handed over once the body is gone")
            .expect("task");
        guard.expect("acquired").release().await.expect("release");
        assert!(
            body_had_ended,
            "the next holder got the key before the body ended"
        );
        let outcome = tokio::time::timeout(LIMIT, body)
            .await
            .expect("the body is stopped")
            .expect("task");
        assert!(
            matches!(
                outcome,
                Err(LockError::Lost {
                    reason: LostReason::Shutdown,
                    ..
                })
            ),
            "{outcome:?}"
        );
        assert_eq!(
            tokio::time::timeout(LIMIT, shutdown)
                .await
                .expect("shutdown ends")
                .expect("task"),
            1
        );
    })
    .await;
}

/// A guard dropped just before its registry's last handle (the end of a scope that made both)
/// is still released: the lock goes to the next caller at once, not after its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_with_the_last_handle_of_its_registry_is_still_released() {
    let server = lock_tests::RedisServer::start();
    for i in 0..20 {
        let registry = super::support::registry(&server);
        let _guard = registry
            .lock(format!("scoped:{i}"))
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        // The guard goes first, then the registry, as at the end of this block.
    }
    let mut con = server.connection();
    eventually(
        Duration::from_secs(10),
        "every scoped lock released",
        || {
            let keys: Vec<String> = redis::cmd("KEYS").arg("lock:*").query(&mut con).unwrap();
            async move { keys.is_empty() }
        },
    )
    .await;
}
