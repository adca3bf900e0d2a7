//! Read-write locks (`mode = "read"`): readers side by side, each with a lease of its own, and
//! writers alone; a waiting writer is not starved by readers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, Mode, Registry};
use lock_tests::RedisServer;
use tokio::task::JoinHandle;

use super::support::{on_redis_and_memory, registry};

/// A read lock on `catalog` through `a`, and a writer queued behind it through `b` (waiting
/// up to `wait`); returns once new readers are held back by that writer.
async fn reader_and_queued_writer(
    a: &Registry,
    b: &Registry,
    wait: Duration,
) -> (LockGuard, JoinHandle<Result<LockGuard, LockError>>) {
    let reader = a.lock("catalog").mode(Mode::Read).acquire().await.unwrap();
    let writer = tokio::spawn(b.lock("catalog").wait(wait).acquire());
    lock_tests::eventually(Duration::from_secs(10), "new readers held back", || async {
        a.lock("catalog")
            .mode(Mode::Read)
            .acquire()
            .await
            .is_err_and(|e| e.is_busy())
    })
    .await;
    (reader, writer)
}

/// A writer that waits stops new readers, even while others still read: the last reader's
/// release hands it the lock, however many readers keep arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_not_starved_by_arriving_readers() {
    on_redis_and_memory(|a, b| async move {
        let (reader, writer) = reader_and_queued_writer(&a, &b, Duration::from_secs(20)).await;
        reader.release().await.unwrap();
        let writer = writer
            .await
            .unwrap()
            .expect("handed the lock by the last reader");
        let info = a.inspect("catalog").await.unwrap();
        assert_eq!(info.owner.as_deref(), Some(writer.token()));
        writer.release().await.unwrap();
        a.lock("catalog")
            .mode(Mode::Read)
            .acquire()
            .await
            .expect("readers again once the writer is done")
            .release()
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_and_no_writer_ever_overlaps_anyone() {
    let server = RedisServer::start();
    let registries: Vec<_> = (0..3).map(|_| registry(&server)).collect();
    let (readers, writers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let reg = registries[i % registries.len()].clone();
            let (readers, writers, most_readers) =
                (readers.clone(), writers.clone(), most_readers.clone());
            // Two writers, ten readers.
            let mode = if i % 6 == 0 { Mode::Write } else { Mode::Read };
            tokio::spawn(async move {
                for _ in 0..8 {
                    reg.lock("catalog")
                        .mode(mode)
                        .wait(Duration::from_secs(30))
                        .run(async {
                            let mine = if mode == Mode::Write {
                                &writers
                            } else {
                                &readers
                            };
                            let now = mine.fetch_add(1, Ordering::SeqCst) + 1;
                            let (r, w) = (
                                readers.load(Ordering::SeqCst),
                                writers.load(Ordering::SeqCst),
                            );
                            assert!(w == 0 || (w == 1 && r == 0), "{w} writers, {r} readers");
                            if mode == Mode::Read {
                                most_readers.fetch_max(now, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            mine.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, LockError>(())
                        })
                        .await
                        .unwrap_or_else(|e| panic!("task {i}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no writer overlapped anyone");
    }
    let most = most_readers.load(Ordering::SeqCst);
    assert!(most >= 2, "readers never overlapped ({most} at most)");
}

#[tokio::test]
async fn a_writer_may_read_inside_but_a_reader_may_not_write() {
    on_redis_and_memory(|a, _| async move {
        let inner = a.clone();
        a.lock("catalog")
            .run(async move {
                inner
                    .lock("catalog")
                    .mode(Mode::Read)
                    .run(async { Ok::<_, LockError>(()) })
                    .await
            })
            .await
            .expect("a writer re-enters its lock to read");
        let inner = a.clone();
        let err = a
            .lock("catalog")
            .mode(Mode::Read)
            .run(async move {
                inner
                    .lock("catalog")
                    .run(async { Ok::<_, LockError>(()) })
                    .await
            })
            .await
            .unwrap_err();
        let LockError::InvalidOptions { reason, .. } = &err else {
            panic!("an upgrade is refused, not waited for: {err:?}");
        };
        assert!(reason.contains("wait for itself"), "{reason}");
        assert!(a.held().is_empty(), "both released");
    })
    .await;
}

#[tokio::test]
async fn a_read_lock_and_a_semaphore_on_one_key_are_refused_and_told_why() {
    on_redis_and_memory(|a, b| async move {
        let reader = a.lock("catalog").mode(Mode::Read).acquire().await.unwrap();
        let err = b.lock("catalog").permits(2).acquire().await.unwrap_err();
        let LockError::InvalidOptions { reason, .. } = &err else {
            panic!("a mismatch is an error: {err:?}");
        };
        assert!(
            reason.contains("it is a read lock") && reason.contains("semaphore of 2 permits"),
            "{reason}"
        );
        reader.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn read_mode_with_permits_or_fencing_is_refused() {
    let registry = Registry::in_memory();
    for (request, word) in [
        (registry.lock("k").mode(Mode::Read).permits(2), "permits"),
        (registry.lock("k").mode(Mode::Read).fencing(true), "fencing"),
    ] {
        let err = request.acquire().await.unwrap_err();
        assert!(
            matches!(&err, LockError::InvalidOptions { reason, .. } if reason.contains(word)),
            "{err:?}"
        );
    }
}

/// Regression: a queued writer that gave up left the readers it held off asleep until their
/// own waits ran out (its release told nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_held_off_by_a_writer_enter_when_it_gives_up() {
    on_redis_and_memory(|a, b| async move {
        let (reader, writer) = reader_and_queued_writer(&a, &b, Duration::from_secs(1)).await;
        // Held off by the writer, with a wait far beyond the writer's: its last attempt, at
        // the end of that wait, would get in anyway.
        let second = tokio::spawn({
            let b = b.clone();
            async move {
                b.lock("catalog")
                    .mode(Mode::Read)
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
            }
        });
        assert!(
            writer.await.unwrap().unwrap_err().is_busy(),
            "the writer gave up"
        );
        lock_tests::eventually(
            Duration::from_secs(5),
            "the held-off reader let in",
            || async { a.inspect("catalog").await.unwrap().readers == Some(2) },
        )
        .await;
        second.await.unwrap().unwrap().release().await.unwrap();
        reader.release().await.unwrap();
    })
    .await;
}

/// Regression: a read lock kept for `min_hold` (its place shortened to what is left of it)
/// kept the whole key for its original ttl, so a writer waited for a minute, not a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_the_key_when_the_last_readers_place_runs_out() {
    on_redis_and_memory(|a, b| async move {
        a.lock("catalog")
            .mode(Mode::Read)
            .ttl(Duration::from_secs(60))
            .min_hold(Duration::from_millis(300))
            .run(async { Ok::<_, LockError>(()) })
            .await
            .unwrap();
        let writer = b
            .lock("catalog")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("the reader's place ran out well within the writer's wait");
        writer.release().await.unwrap();
    })
    .await;
}

/// Regression: a reader held off while a writer is queued left no mark for that writer, so the
/// writer, once handed the lock, released it with a plain delete that told nobody, and the
/// reader slept until its wait's bound ran out: a ttl (30 s here, and in the catalog example).
/// Held off by the queued writer while readers hold the key, or by the lock's holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_held_off_while_a_writer_queues_enters_when_that_writer_releases() {
    for holder in [Mode::Read, Mode::Write] {
        let server = RedisServer::start();
        let (a, b) = (registry(&server), registry(&server));
        let first = a.lock("catalog").mode(holder).acquire().await.unwrap();
        let writer = tokio::spawn(b.lock("catalog").wait(Duration::from_secs(30)).acquire());
        lock_tests::eventually(Duration::from_secs(10), "the writer queued", || async {
            a.inspect("catalog").await.unwrap().waiters == 1
        })
        .await;
        let url = server.url();
        let (scripts, _) = lock_tests::command_counts(&url, "evalsha").await;
        let reader = tokio::spawn({
            let a = a.clone();
            async move {
                a.lock("catalog")
                    .mode(Mode::Read)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            }
        });
        // Its first attempt, and the one after it subscribed: both refused, so it waits now.
        lock_tests::eventually(
            Duration::from_secs(10),
            "the reader refused twice",
            || async { lock_tests::command_counts(&url, "evalsha").await.0 >= scripts + 2 },
        )
        .await;
        first.release().await.unwrap();
        let writer = writer
            .await
            .unwrap()
            .expect("handed the lock by its holder");
        writer.release().await.unwrap();
        let reader = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "held off behind a {holder:?} holder, the reader enters when the writer \
                     releases, not when its wait's bound (30 s) runs out"
                )
            })
            .unwrap()
            .expect("a read lock");
        reader.release().await.unwrap();
    }
}
