//! A held lock: what its holder can ask of it, and how it is given back.

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, Span};

use crate::backend::{Renewal, Renewed, Store};
use crate::error::LockError;
use crate::keeper::Keeper;
use crate::lease::Lease;
use crate::spans;
use crate::state::RegistryInner;

/// A held lock. Release it with [`release`](Self::release) (honours `min_hold`) or
/// [`release_now`](Self::release_now); dropping it releases at once in the background.
///
/// While the guard lives, the registry's lease keeper renews the lock (unless `renew` is off).
#[must_use = "dropping a guard releases the lock at once"]
pub struct LockGuard {
    pub(crate) inner: Arc<RegistryInner>,
    pub(crate) lease: Arc<Lease>,
    /// Shares a lease the task already held; releasing it is the outer holder's job.
    pub(crate) reentrant: bool,
    done: bool,
    /// The lease's `lock.hold` span, open until the lock is given back: the release's parent,
    /// also when the lease was lost (and its span ended) before; a guarded body runs in it.
    pub(crate) hold: Span,
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
    /// The guard of a lease just acquired: it releases the lock when done or dropped.
    pub(crate) fn new(inner: Arc<RegistryInner>, lease: Arc<Lease>) -> Self {
        let hold = lease.span();
        Self {
            inner,
            lease,
            reentrant: false,
            done: false,
            hold,
        }
    }

    /// A guard sharing a lease the task already holds: it never releases anything.
    pub(crate) fn reentered(inner: Arc<RegistryInner>, lease: Arc<Lease>) -> Self {
        Self {
            inner,
            lease,
            reentrant: true,
            done: true,
            hold: Span::none(),
        }
    }

    /// The key as given (without the registry prefix); of a multi-key lock, its keys sorted
    /// and joined by ` + `.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.lease.key.name
    }

    /// The Redis key that holds the lock; of a multi-key lock, its first key's.
    #[must_use]
    pub fn redis_key(&self) -> &str {
        &self.lease.key.stored
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

    /// On a Postgres registry: what makes the application's own transaction commit only while
    /// this lock is held ([`TransactionCheck`](crate::TransactionCheck)); `None` on the others.
    #[must_use]
    pub fn transaction_check(&self) -> Option<crate::transaction::TransactionCheck> {
        crate::transaction::TransactionCheck::of(&self.inner.backend, &self.lease)
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
    pub fn lost_reason(&self) -> Option<crate::error::LostReason> {
        self.lease.lost_reason()
    }

    /// Whether the lease is at risk: a renewal failed, or went unanswered for a third of the
    /// ttl, and none has been confirmed since, while the lease still holds (Chubby's
    /// "jeopardy", Curator's `SUSPENDED`). Work that must not outlive the lock, a leader's
    /// above all, can stop taking new work until it is safe again or lost. `false` once lost.
    #[must_use]
    pub fn is_at_risk(&self) -> bool {
        self.lease.is_at_risk()
    }

    /// Resolves when the lease is at risk (see [`is_at_risk`](Self::is_at_risk)) or lost; at
    /// once if it already is.
    pub async fn at_risk(&self) {
        self.lease.wait_risk(true).await;
    }

    /// Resolves when the lease is no longer at risk: a renewal was confirmed, or it is lost;
    /// at once if it is not at risk now.
    pub async fn out_of_risk(&self) {
        self.lease.wait_risk(false).await;
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
        let span = spans::release(&self.hold, keep);
        let outcome = self.give_back(keep).instrument(span.clone()).await;
        spans::released(&span, outcome.as_ref().map(|_| ()), keep.is_some());
        outcome
    }

    /// [`finish`](Self::finish) without its span.
    async fn give_back(&self, keep: Option<Duration>) -> Result<(), LockError> {
        let keeper = &self.inner.keeper;
        let lease = &self.lease;
        // Over for every clone before the release can let the next holder in.
        lease.end();
        keeper.begin_release(lease.id);
        let mut unfinished = Unfinished {
            keeper,
            id: lease.id,
            keeping: keep.is_some(),
            armed: true,
        };
        let outcome = match keep {
            Some(left) => {
                let renewal: Vec<Renewal<'_>> = lease.renewals(left).collect();
                match self
                    .inner
                    .backend
                    .renew(&renewal, lease.options.ttl / 3)
                    .await
                {
                    Ok(kept) => match Renewed::of_all(&kept) {
                        Some(kept) => Ok(kept == Renewed::Yes),
                        // Unconfirmed: deleting in the background would undo `min_hold`, so the
                        // key is left to its current expiry instead.
                        None => {
                            unfinished.armed = false;
                            keeper.remove(lease.id);
                            return Err(LockError::Backend {
                                node: self.inner.backend.node().to_owned(),
                                command: "release (min_hold)",
                                key: Some(lease.key.name.clone()),
                                message: "the nodes did not confirm keeping the key".to_owned(),
                                source: None,
                            });
                        }
                    },
                    Err(e) => Err(e),
                }
            }
            None => lease.give_back(&self.inner.backend).await,
        };
        unfinished.armed = false;
        match outcome {
            Ok(true) => {
                keeper.remove(lease.id);
                tracing::debug!(
                    key = %crate::error::shown(&lease.key.name),
                    fence = lease.fence,
                    kept_ms = keep.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    "lock released"
                );
                Ok(())
            }
            Ok(false) => {
                keeper.remove(lease.id);
                Err(LockError::NotOwner {
                    key: lease.key.name.clone(),
                })
            }
            Err(error) => {
                keeper.release_in_background(lease.id);
                Err(error)
            }
        }
    }
}

/// A release whose future is dropped before the server answered: the keeper finishes it, so the
/// lease is never left "releasing" forever. A `min_hold` keep is only forgotten (the key keeps
/// its expiry): deleting it would undo `min_hold`.
struct Unfinished<'a> {
    keeper: &'a Keeper,
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
            self.keeper.remove(self.id);
        } else {
            self.keeper.release_in_background(self.id);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            self.lease.end();
            // No runtime is needed here: the keeper task performs the release.
            self.inner.keeper.release_in_background(self.lease.id);
        }
    }
}
