//! Taking a lock: the request builder, the acquisition loop, the guard, and guarded bodies.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Attempt;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::registry::{Registry, RegistryInner};
use crate::{current, token, LockError, LockOptions, OnLost};

/// A lock request: built by [`Registry::lock`], finished by [`acquire`](Self::acquire) or
/// [`run`](Self::run).
#[must_use = "a lock request does nothing until `.acquire()` or `.run(..)` is awaited"]
#[derive(Debug)]
pub struct LockRequest {
    registry: Registry,
    key: String,
    options: LockOptions,
}

impl LockRequest {
    pub(crate) fn new(registry: Registry, key: String) -> Self {
        Self {
            registry,
            key,
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
        let inner = self.registry.inner;
        if let Some(lease) = current::held(&inner, &self.key) {
            return Ok(LockGuard {
                inner,
                lease,
                reentrant: true,
                done: true,
            });
        }
        let lease = if inner.on_caller_runtime() {
            acquire_lease(inner.clone(), self.key, self.options).await?
        } else {
            // The whole acquisition (attempts, subscribing, waiting) runs on the I/O runtime,
            // next to the connections: a release notification wakes the waiter there and its
            // next attempt goes out at once, with no other thread to wake in between; only the
            // outcome crosses over to the caller.
            acquire_on_io(inner.clone(), self.key, self.options).await?
        };
        Ok(LockGuard {
            inner,
            lease,
            reentrant: false,
            done: false,
        })
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
            return body.await;
        }
        let body = current::scope(guard.inner.clone(), guard.lease.clone(), body);
        let outcome = match on_lost {
            OnLost::Cancel => {
                let mut body = std::pin::pin!(body);
                tokio::select! {
                    biased;
                    outcome = &mut body => Ok(outcome),
                    reason = guard.lease.wait_lost() => Err(reason),
                }
            }
            OnLost::Continue => Ok(body.await),
        };
        // A body that completes in the very poll it resumes in (after a process pause, a GC, a
        // blocking call) can outrun the loss timer: under Cancel, a lease that is already past
        // its deadline means the work may have overlapped the next holder's, so say so.
        let outcome = match (on_lost, guard.lease.lost_reason()) {
            (OnLost::Cancel, Some(reason)) if outcome.is_ok() => Err(reason),
            _ => outcome,
        };
        match outcome {
            Ok(Ok(value)) => {
                // The work is done; a failed release is retried in the background and logged.
                let _ = guard.release().await;
                Ok(value)
            }
            Ok(Err(error)) => {
                let _ = guard.release_now().await;
                Err(error)
            }
            Err(reason) => {
                let error = guard.lease.lost_error(reason);
                let _ = guard.release_now().await;
                Err(error.into())
            }
        }
    }
}

/// [`acquire_lease`] as a task on the I/O runtime, cancelled when the caller stops waiting. A
/// lock taken just as the caller gave up is released, never left held with no guard.
async fn acquire_on_io(
    inner: Arc<RegistryInner>,
    key: String,
    options: LockOptions,
) -> Result<Arc<Lease>, LockError> {
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let (deliver, delivered) = tokio::sync::oneshot::channel();
    let task = crate::io::spawn(async move {
        let outcome = acquire_lease(inner.clone(), key, options).await;
        if let Err(Ok(lease)) = deliver.send(outcome) {
            inner.leases.release_in_background(lease.id);
        }
    });
    let _cancel_with_the_caller = AbortOnDrop(task.abort_handle());
    delivered
        .await
        .unwrap_or_else(|_| panic!("lock-runtime: the acquisition task ended without an outcome"))
}

/// Acquires with `token`, waiting for notifications while the lock is busy.
async fn acquire_lease(
    inner: Arc<RegistryInner>,
    key: String,
    options: LockOptions,
) -> Result<Arc<Lease>, LockError> {
    let inner = &inner;
    options.validate(&key)?;
    inner.ensure_open(&key)?;
    let key = inner.lock_key(key)?;
    let token = token::new_token();
    let started = Instant::now();
    // `Duration::MAX` is the natural "wait as long as it takes": beyond the clock's range means
    // no deadline at all (a century stands in for it).
    let give_up_at = started
        .checked_add(options.wait)
        .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
    let hub = inner.backend.hub();
    let mut interest = None;
    let mut attempts = 0u32;
    let mut failed_attempt = false;
    loop {
        attempts += 1;
        let sent_at = Instant::now();
        let attempt = inner
            .backend
            .acquire(&key, &token, options.ttl, options.fencing, attempts == 1)
            .await;
        let now = Instant::now();
        let wake_at = match attempt {
            Ok(Attempt::Acquired { fence }) => {
                let lease = Lease::new(inner.next_lease_id(), key, token, fence, options, sent_at);
                inner.admit(&lease).await?;
                tracing::debug!(
                    key = %crate::error::shown(&lease.key.key),
                    fence = lease.fence,
                    attempts,
                    waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "lock acquired"
                );
                return Ok(lease);
            }
            Ok(Attempt::Busy { retry_after }) => {
                if now >= give_up_at {
                    if failed_attempt {
                        forget_token_in_background(inner.clone(), key.clone_names(), token);
                    }
                    return Err(LockError::Busy {
                        key: key.key,
                        retry_after,
                    });
                }
                let Some(current) = &interest else {
                    // Subscribe first, then try again at once: a release that happened since the
                    // failed attempt would otherwise go unnoticed until the lease ran out.
                    interest = Some(hub.interest(key.channel(), give_up_at).await);
                    continue;
                };
                // A lost message costs at most the holder's remaining lease.
                let mut at = match retry_after {
                    Some(left) => sent_at + left + Duration::from_millis(1),
                    None => now + Duration::from_secs(1),
                };
                if !current.notified_by_server {
                    at = at.min(now + backoff(attempts));
                }
                at.min(give_up_at)
            }
            Err(error) => {
                failed_attempt = true;
                if now >= give_up_at {
                    forget_token_in_background(inner.clone(), key, token);
                    return Err(error);
                }
                tracing::debug!(%error, "lock attempt failed; retrying within `wait`");
                (now + backoff(attempts)).min(give_up_at)
            }
        };
        match &interest {
            Some(current) => {
                tokio::select! {
                    () = current.released() => {}
                    () = tokio::time::sleep_until(wake_at) => {}
                }
            }
            None => tokio::time::sleep_until(wake_at).await,
        }
    }
}

/// Jittered exponential back-off, 10 ms doubling to 1 s, for retries that no notification
/// can shorten (errors, or waiting where pub/sub is unavailable).
fn backoff(attempt: u32) -> Duration {
    let cap = Duration::from_millis(10 << attempt.min(7)).min(Duration::from_secs(1));
    let jitter = getrandom::u32().unwrap_or(0) % 1000;
    cap / 2 + cap * jitter / 2000
}

/// After a failed attempt the lock may exist with our token (the reply, not the command, was
/// lost). Nobody will ever release it, so try once; it would expire by its ttl anyway.
fn forget_token_in_background(inner: Arc<RegistryInner>, key: LockKey, token: String) {
    let task = inner.clone();
    inner.spawn_background(async move {
        let _ = task.backend.release(&key, &token).await;
    });
}

/// A held lock. Release it with [`release`](Self::release) (honours `min_hold`) or
/// [`release_now`](Self::release_now); dropping it releases at once in the background.
///
/// While the guard lives, the registry's lease keeper renews the lock (unless `renew` is off).
#[must_use = "dropping a guard releases the lock at once"]
pub struct LockGuard {
    inner: Arc<RegistryInner>,
    lease: Arc<Lease>,
    /// Shares a lease the task already held; releasing it is the outer holder's job.
    reentrant: bool,
    done: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .field("reentrant", &self.reentrant)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The key as given (without the registry prefix).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.lease.key.key
    }

    /// The Redis key that holds the lock.
    #[must_use]
    pub fn redis_key(&self) -> &str {
        &self.lease.key.redis_key
    }

    /// The fencing token, when the lock was taken with `fencing`.
    #[must_use]
    pub fn fence(&self) -> Option<u64> {
        self.lease.fence
    }

    /// This owner's token, as stored in Redis.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.lease.token
    }

    /// Whether this guard re-entered a lock the task already held.
    #[must_use]
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Whether the lease is lost (or past its deadline without a confirmed renewal).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// Why the lease is lost, if it is (or `Expired` once past its deadline unconfirmed).
    #[must_use]
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.lease.lost_reason()
    }

    /// Resolves when the lease is lost, with the error that says why.
    pub async fn lost(&self) -> LockError {
        let reason = self.lease.wait_lost().await;
        self.lease.lost_error(reason)
    }

    /// Releases the lock, but if `min_hold` was set and has not passed yet, keeps the key until
    /// it has (without renewing): the run-once-per-period pattern.
    ///
    /// # Errors
    /// [`LockError::NotOwner`] if the lock was no longer ours (nothing was touched);
    /// [`LockError::Backend`] if Redis failed, in which case the release is retried in the
    /// background until it succeeds or the lock has expired.
    pub async fn release(self) -> Result<(), LockError> {
        let keep = self.lease.min_hold_left();
        self.finish(keep).await
    }

    /// Releases the lock at once, whatever `min_hold` says.
    ///
    /// # Errors
    /// As [`release`](Self::release).
    pub async fn release_now(self) -> Result<(), LockError> {
        self.finish(None).await
    }

    async fn finish(mut self, keep: Option<Duration>) -> Result<(), LockError> {
        if self.reentrant {
            return Ok(());
        }
        self.done = true;
        let leases = &self.inner.leases;
        let lease = &self.lease;
        leases.begin_release(lease.id);
        let mut unfinished = Unfinished {
            leases,
            id: lease.id,
            keeping: keep.is_some(),
            armed: true,
        };
        let outcome = match keep {
            Some(left) => {
                let renewal = [crate::backend::Renewal {
                    redis_key: &lease.key.redis_key,
                    token: &lease.token,
                    ttl_ms: crate::backend::ttl_ms(left),
                }];
                match self
                    .inner
                    .backend
                    .renew(&renewal, lease.options.ttl / 3)
                    .await
                {
                    Ok(kept) => match kept.first().copied().flatten() {
                        Some(kept) => Ok(kept == crate::backend::Renewed::Yes),
                        // Unconfirmed: deleting in the background would undo `min_hold`, so the
                        // key is left to its current expiry instead.
                        None => {
                            unfinished.armed = false;
                            leases.remove(lease.id);
                            return Err(LockError::Backend {
                                node: self.inner.backend.node().to_owned(),
                                command: "release (min_hold)",
                                key: Some(lease.key.key.clone()),
                                message: "the nodes did not confirm keeping the key".to_owned(),
                                source: None,
                            });
                        }
                    },
                    Err(e) => Err(e),
                }
            }
            None => self.inner.backend.release(&lease.key, &lease.token).await,
        };
        unfinished.armed = false;
        match outcome {
            Ok(true) => {
                leases.remove(lease.id);
                tracing::debug!(
                    key = %crate::error::shown(&lease.key.key),
                    fence = lease.fence,
                    kept_ms = keep.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    "lock released"
                );
                Ok(())
            }
            Ok(false) => {
                leases.remove(lease.id);
                Err(LockError::NotOwner {
                    key: lease.key.key.clone(),
                })
            }
            Err(error) => {
                leases.release_in_background(lease.id);
                Err(error)
            }
        }
    }
}

/// A release whose future is dropped before the server answered: the keeper finishes it, so the
/// lease is never left "releasing" forever. A `min_hold` keep is only forgotten (the key keeps
/// its expiry): deleting it would undo `min_hold`.
struct Unfinished<'a> {
    leases: &'a crate::keeper::Leases,
    id: u64,
    keeping: bool,
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.keeping {
            self.leases.remove(self.id);
        } else {
            self.leases.release_in_background(self.id);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            // No runtime is needed here: the keeper task performs the release.
            self.inner.leases.release_in_background(self.lease.id);
        }
    }
}
