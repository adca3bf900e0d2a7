//! Lock steps tests share: a warm-up cycle, a holder whose body hangs (with or without a handle
//! on its lease), and the check that a lease was lost for the expected reason.

/// One lock cycle, so `registry`'s connection is made and its scripts loaded before a fault is
/// injected: the fault then hits the operation under test, not the handshake.
///
/// # Panics
/// When the cycle fails.
pub async fn warm_up(registry: &lock_runtime::Registry) {
    registry
        .lock("warm-up")
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
