//! Lock steps tests share: a warm-up cycle, a holder whose body hangs (with or without a handle
//! on its lease), the check that a lease was lost for the expected reason, and the ttl a test
//! relies on being renewed.

use std::time::Duration;

/// The ttl of a lease a test expects to be renewed (held across several ttls, or lost for a
/// reason a renewal finds). Each renewal has a third of it to answer: a test process starved
/// by CPU hogs takes well over 100 ms for a round trip now and then, which loses a 300 ms lease
/// as `Expired`, correctly, and fails the test for the wrong reason.
pub const RENEWED_TTL: Duration = Duration::from_secs(1);

/// One lock cycle, so `registry`'s connection is made and its scripts loaded before a fault is
/// injected: the fault then hits the operation under test, not the handshake. A first connect
/// that outlasts a test registry's short connect timeout on a loaded machine (a TLS handshake
/// with a sentinel, then with the master) is tried again within 10 s.
///
/// # Panics
/// When the cycle fails.
pub async fn warm_up(registry: &lock_runtime::Registry) {
    registry
        .lock("warm-up")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("warm-up lock")
        .release()
        .await
        .expect("warm-up release");
}

/// Spawns `request.run(..)` with a body that never finishes; returns once the body runs.
///
/// # Panics
/// When the body never starts.
pub async fn spawn_hung_body(
    request: lock_runtime::LockRequest,
) -> tokio::task::JoinHandle<Result<(), lock_runtime::LockError>> {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(request.run(async move {
        started_tx.send(()).expect("the test waits for the body");
        std::future::pending().await
    }));
    started.await.expect("the body started");
    task
}

/// As [`spawn_hung_body`], and also returns the body's [`CurrentLock`](lock_runtime::CurrentLock):
/// its token, and whether its lease is lost as the body would see it.
///
/// # Panics
/// When the body never starts.
pub async fn spawn_hung_body_holding(
    request: lock_runtime::LockRequest,
) -> (
    lock_runtime::CurrentLock,
    tokio::task::JoinHandle<Result<(), lock_runtime::LockError>>,
) {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(request.run(async move {
        let held = lock_runtime::current().expect("a locked body has a current lock");
        started_tx.send(held).expect("the test waits for the body");
        std::future::pending().await
    }));
    let held = started.await.expect("the body started");
    (held, task)
}

/// Fails unless `err` is `Lost` for `expected`.
///
/// # Panics
/// When it is not.
pub fn assert_lost(err: &lock_runtime::LockError, expected: lock_runtime::LostReason) {
    match err {
        lock_runtime::LockError::Lost { reason, .. } if *reason == expected => {}
        other => panic!("expected the lease lost ({expected:?}), got {other:?}"),
    }
}

/// A semaphore of 3 permits on `key`, as every deployment must keep it: three permits held at
/// once from both registries, a fourth taker refused with the soonest permit's lease, a waiter
/// woken by a release (well before the holders' 30 s leases would free a permit), the count
/// shown by `inspect`, and the key gone with the last release.
///
/// # Panics
/// When any of that fails.
pub async fn semaphore_round(a: &lock_runtime::Registry, b: &lock_runtime::Registry, key: &str) {
    use lock_runtime::{LockError, Permits};
    use std::time::Duration;
    let mut held = Vec::new();
    for registry in [a, b, a] {
        let permit = registry.lock(key).permits(3).acquire().await;
        held.push(permit.expect("a free permit"));
    }
    let info = b.inspect(key).await.expect("inspect");
    assert_eq!(info.permits, Some(Permits { held: 3, total: 3 }));
    assert_eq!(info.owner, None, "a semaphore has no single owner");
    let err = b.lock(key).permits(3).acquire().await.unwrap_err();
    let LockError::Busy { retry_after, .. } = err else {
        panic!("a fourth taker is refused: {err:?}");
    };
    assert!(retry_after.is_some_and(|left| left <= Duration::from_secs(30)));
    let waiter = tokio::spawn({
        let (b, key) = (b.clone(), key.to_owned());
        async move {
            b.lock(key)
                .permits(3)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    held.pop()
        .expect("three held")
        .release()
        .await
        .expect("release");
    let fourth = waiter
        .await
        .expect("waiter task")
        .expect("woken by the release");
    let info = a.inspect(key).await.expect("inspect");
    assert_eq!(info.permits, Some(Permits { held: 3, total: 3 }));
    for guard in held.into_iter().chain([fourth]) {
        guard.release().await.expect("release");
    }
    let info = a.inspect(key).await.expect("inspect");
    assert_eq!(info.permits, None, "the last release deletes the key");
}

/// Starts the `lock-holder` binary (`bin`, i.e. `env!("CARGO_BIN_EXE_lock-holder")`) holding
/// `key` on `url` with a lease of `ttl_ms` (one of `permits` permits when given), and returns
/// the process once it holds.
///
/// # Panics
/// When it cannot be started or does not report the lock held.
#[must_use]
pub fn start_holder(
    bin: &str,
    url: &str,
    key: &str,
    ttl_ms: u64,
    permits: Option<u32>,
) -> std::process::Child {
    use std::io::BufRead;
    let mut args = vec![url.to_owned(), key.to_owned(), ttl_ms.to_string()];
    args.extend(permits.map(|p| p.to_string()));
    let mut holder = std::process::Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start lock-holder");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("read lock-holder's output");
    assert!(line.starts_with("held "), "{line}");
    holder
}

/// Runs `tasks` tasks spread over `registries`, each taking `key` (one of `permits` permits when
/// given) `cycles` times for a 2 ms body; returns the most bodies seen inside at once.
///
/// # Panics
/// When a body cannot get in within 30 s.
pub async fn most_inside(
    registries: &[lock_runtime::Registry],
    key: &str,
    permits: Option<u32>,
    tasks: usize,
    cycles: usize,
) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..tasks)
        .map(|i| {
            let (registry, key) = (registries[i % registries.len()].clone(), key.to_owned());
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..cycles {
                    let mut request = registry.lock(key.clone()).wait(Duration::from_secs(30));
                    if let Some(permits) = permits {
                        request = request.permits(permits);
                    }
                    request
                        .run(async {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, lock_runtime::LockError>(())
                        })
                        .await
                        .unwrap_or_else(|e| panic!("task {i}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    most.load(Ordering::SeqCst)
}

/// A read-write lock on `key`, as every deployment must keep it: two readers at once from both
/// registries, a writer refused while they read, the writer alone once they are gone, readers
/// refused while it writes, and every waiting reader in (not one) when it releases, well before
/// its 30 s lease would have ended.
///
/// # Panics
/// When any of that fails.
pub async fn read_write_round(a: &lock_runtime::Registry, b: &lock_runtime::Registry, key: &str) {
    use lock_runtime::Mode;
    use std::time::Duration;
    let read = |registry: &lock_runtime::Registry| registry.lock(key).mode(Mode::Read);
    let readers = [
        read(a).acquire().await.expect("a reader"),
        read(b).acquire().await.expect("a second reader beside it"),
    ];
    assert_eq!(b.inspect(key).await.expect("inspect").readers, Some(2));
    let err = a.lock(key).acquire().await.unwrap_err();
    assert!(err.is_busy(), "a writer waits for the readers: {err:?}");
    for reader in readers {
        reader.release().await.expect("release");
    }
    let writer = a
        .lock(key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("the writer, once the readers are gone");
    let err = read(b).acquire().await.unwrap_err();
    assert!(err.is_busy(), "a reader waits for the writer: {err:?}");
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let request = read(b).wait(Duration::from_secs(10));
            tokio::spawn(request.acquire())
        })
        .collect();
    writer.release().await.expect("release");
    let mut readers = Vec::new();
    for reader in waiting {
        readers.push(
            reader
                .await
                .expect("task")
                .expect("every waiting reader gets in"),
        );
    }
    assert_eq!(a.inspect(key).await.expect("inspect").readers, Some(3));
    for reader in readers {
        reader.release().await.expect("release");
    }
}
