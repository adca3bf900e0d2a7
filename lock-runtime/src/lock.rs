//! Taking a lock: the request (`registry.lock(key)...`), and guarded bodies (`run`). How an
//! acquisition attempts, waits and is handed the lock is `acquisition`'s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquisition;
use crate::guard::LockGuard;
use crate::state::RegistryInner;
use crate::{current, error::LockError, options::LockOptions, options::Mode, options::OnLost};

/// A lock request: built by [`Registry::lock`](crate::Registry::lock), finished by [`acquire`](Self::acquire) or
/// [`run`](Self::run).
#[must_use = "a lock request does nothing until `.acquire()` or `.run(..)` is awaited"]
#[derive(Debug)]
pub struct LockRequest {
    registry: Arc<RegistryInner>,
    /// One key, or a multi-key lock's keys as given.
    keys: Vec<String>,
    options: LockOptions,
}

impl LockRequest {
    pub(crate) fn new(registry: Arc<RegistryInner>, keys: Vec<String>) -> Self {
        Self {
            registry,
            keys,
            options: LockOptions::new(),
        }
    }

    /// Replaces all options at once.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// See [`LockOptions::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// See [`LockOptions::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// See [`LockOptions::renew`].
    pub fn renew(mut self, renew: bool) -> Self {
        self.options = self.options.renew(renew);
        self
    }

    /// See [`LockOptions::on_lost`].
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.options = self.options.on_lost(on_lost);
        self
    }

    /// See [`LockOptions::min_hold`].
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.options = self.options.min_hold(min_hold);
        self
    }

    /// See [`LockOptions::max_hold`].
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options = self.options.max_hold(max_hold);
        self
    }

    /// See [`LockOptions::fencing`].
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.options = self.options.fencing(fencing);
        self
    }

    /// See [`LockOptions::mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.options = self.options.mode(mode);
        self
    }

    /// See [`LockOptions::permits`].
    pub fn permits(mut self, permits: u32) -> Self {
        self.options = self.options.permits(permits);
        self
    }

    /// See [`LockOptions::template`].
    pub fn template(mut self, template: &'static str) -> Self {
        self.options = self.options.template(template);
        self
    }

    /// Takes the lock, waiting up to `wait` for a busy one.
    ///
    /// If the running task already holds this key through this registry (inside a guarded body),
    /// the guard shares that lease and releasing it does nothing.
    ///
    /// # Errors
    /// [`LockError::Busy`] when the lock stayed taken for the whole `wait`;
    /// [`LockError::Backend`] when Redis failed (the last error, if it kept failing for the whole
    /// `wait`); [`LockError::InvalidKey`] / [`LockError::InvalidOptions`] for bad input.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let inner = self.registry;
        match current::held(&inner, &self.keys) {
            current::Held::No => {}
            current::Held::All(lease) => {
                // A lease already over is not re-entered: the key may be someone else's now.
                if let Some(reason) = lease.lost_reason() {
                    return Err(lease.lost_error(reason));
                }
                let (held, asked) = (lease.options.share(), self.options.share());
                let fenced = (lease.fence.is_some(), self.options.fencing);
                if let Some(reason) = current::cannot_reenter(held, asked, fenced) {
                    return Err(LockError::InvalidOptions {
                        key: self.keys.join(" + "),
                        reason,
                    });
                }
                return Ok(LockGuard::reentered(inner, lease));
            }
            current::Held::Some(held) => {
                return Err(LockError::InvalidOptions {
                    key: self.keys.join(" + "),
                    reason: format!(
                        "this task already holds `{held}` in another lock; a lock over several \
                         keys takes them all in one request (keys taken one request at a time is \
                         how two tasks deadlock), so take them together from the start"
                    ),
                });
            }
        }
        let lease =
            acquisition::acquire_lease(inner.clone(), self.keys, self.options, None).await?;
        Ok(LockGuard::new(inner, lease))
    }

    /// Runs `body` while holding the lock, and releases it afterwards.
    ///
    /// - `Ok` from the body releases the lock, keeping it until `min_hold` has passed if set.
    /// - `Err` from the body releases at once, so another replica can retry.
    /// - If the lease is lost, `on_lost = Cancel` drops the body before the key can expire on the
    ///   server and returns [`LockError::Lost`]; `Continue` lets it finish.
    /// - Dropping the returned future releases the lock in the background.
    /// - A body that already holds this key (nested call in the same task) runs directly inside
    ///   the existing lease.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = lock_runtime::Registry::in_memory();
    /// let report = registry
    ///     .lock("report:daily")
    ///     .run(async { Ok::<_, lock_runtime::LockError>("done") })
    ///     .await?;
    /// assert_eq!(report, "done");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The body's own errors, and every [`LockRequest::acquire`] error converted with
    /// `E::from`, plus [`LockError::Lost`] when the lease was lost under `OnLost::Cancel`.
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let on_lost = self.options.on_lost;
        let guard = self.acquire().await?;
        if guard.reentrant {
            // Inside the outer body's lease: stopped with it under `Cancel`, also when the
            // outer body runs on under `Continue`.
            return match on_lost {
                OnLost::Cancel => tokio::select! {
                    biased;
                    reason = guard.lease.wait_lost() => Err(guard.lease.lost_error(reason).into()),
                    outcome = body => outcome,
                },
                OnLost::Continue => body.await,
            };
        }
        match guarded(guard, on_lost, body).await {
            Ok(outcome) => outcome,
            Err(lost) => Err(lost.into()),
        }
    }
}

/// Runs `body` under `guard`'s lease (see [`LockRequest::run`]) and gives the lock back: the
/// body's outcome, or the error that says why its lease was lost (`Cancel` stopped it, or
/// it finished too late to count).
pub(crate) async fn guarded<T, E, F>(
    guard: LockGuard,
    on_lost: OnLost,
    body: F,
) -> Result<Result<T, E>, LockError>
where
    F: Future<Output = Result<T, E>>,
{
    // Declared before the body, so dropped after it, also when this future is dropped.
    let body_runs = guard.lease.guarding();
    let body = current::scope(guard.inner.clone(), guard.lease.clone(), body)
        .instrument(guard.hold.clone());
    let outcome = match on_lost {
        OnLost::Cancel => {
            let mut body = std::pin::pin!(body);
            // The loss first: a body is never polled, not even once, with a lease that is
            // already lost (a process paused between the acquisition and this poll).
            tokio::select! {
                biased;
                reason = guard.lease.wait_lost() => Err(reason),
                outcome = &mut body => Ok(outcome),
            }
        }
        OnLost::Continue => Ok(body.await),
    };
    drop(body_runs);
    // A body that completes in the very poll it resumes in (after a process pause, a GC, a
    // blocking call) can outrun the loss timer: under Cancel, a lease that is already past
    // its deadline means the work may have overlapped the next holder's, so say so.
    let outcome = match (on_lost, guard.lease.lost_reason()) {
        (OnLost::Cancel, Some(reason)) if outcome.is_ok() => {
            guard.lease.mark_lost(reason);
            Err(reason)
        }
        _ => outcome,
    };
    match outcome {
        Ok(Ok(value)) => {
            // The work is done; a failed release is retried in the background and logged.
            let _ = guard.release().await;
            Ok(Ok(value))
        }
        Ok(Err(error)) => {
            let _ = guard.release_now().await;
            Ok(Err(error))
        }
        Err(reason) => {
            let error = guard.lease.lost_error(reason);
            let _ = guard.release_now().await;
            Err(error)
        }
    }
}
