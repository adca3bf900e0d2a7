//! The locks the running task holds: `current()` and task-aware reentrancy.
//!
//! Each guarded body runs inside a task-local frame that points at its lease and at the frame
//! it was nested in. A lock request for a key that a frame of the same registry already holds
//! runs inside that lease instead of deadlocking against itself. Frames live in the future, not
//! in the thread, so a task that moves between worker threads keeps them, and a task spawned
//! from inside a body does not inherit them: it is another holder and must acquire.

use std::sync::Arc;

use crate::error::LockError;
use crate::lease::Lease;
use crate::options::Share;
use crate::state::RegistryInner;

tokio::task_local! {
    static FRAME: Arc<Frame>;
}

pub(crate) struct Frame {
    registry: Arc<RegistryInner>,
    pub(crate) lease: Arc<Lease>,
    parent: Option<Arc<Frame>>,
}

/// The innermost lock held by the running task, from inside a guarded body
/// ([`LockRequest::run`](crate::LockRequest::run) or a `#[distributed_lock]` fn).
#[derive(Clone)]
pub struct CurrentLock {
    frame: Arc<Frame>,
}

impl std::fmt::Debug for CurrentLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentLock")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .finish_non_exhaustive()
    }
}

/// The innermost lock the running task holds, or `None` outside any guarded body.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let registry = lock_runtime::Registry::in_memory();
/// assert!(lock_runtime::current().is_none());
/// registry
///     .lock("invoice:7")
///     .fencing(true)
///     .run(async {
///         let held = lock_runtime::current().expect("inside the body");
///         assert_eq!(held.key(), "invoice:7");
///         assert_eq!(held.fence(), Some(1));
///         Ok::<_, lock_runtime::LockError>(())
///     })
///     .await
/// # }
/// ```
#[must_use]
pub fn current() -> Option<CurrentLock> {
    FRAME
        .try_with(Arc::clone)
        .ok()
        .map(|frame| CurrentLock { frame })
}

impl CurrentLock {
    /// The key as given to the lock (without the registry prefix); of a multi-key lock, its
    /// keys sorted and joined by ` + `.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.frame.lease.key.name
    }

    /// The Redis key that holds the lock (prefix included); of a multi-key lock, its first
    /// key's.
    #[must_use]
    pub fn redis_key(&self) -> &str {
        &self.frame.lease.key.stored
    }

    /// The fencing token, when the lock was taken with fencing. Pass it to the storage you
    /// write to and have it reject writes that carry a lower token than one it has seen.
    #[must_use]
    pub fn fence(&self) -> Option<u64> {
        self.frame.lease.fence
    }

    /// This owner's token, as stored in Redis.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.frame.lease.token
    }

    /// On a Postgres registry: what makes the application's own transaction commit only while
    /// this lock is held ([`TransactionCheck`](crate::TransactionCheck)); `None` on the others.
    #[must_use]
    pub fn transaction_check(&self) -> Option<crate::transaction::TransactionCheck> {
        crate::transaction::TransactionCheck::of(&self.frame.registry.backend, &self.frame.lease)
    }

    /// Whether the lease is over: lost, past its deadline without a confirmed renewal, or
    /// ended here (the body returned, or its guard was released or dropped). A clone kept by a
    /// task the body spawned sees the end before the next holder can be let in.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.frame.lease.lost_reason().is_some()
    }

    /// Whether the lease is at risk: a renewal failed, or went unanswered for a third of the
    /// ttl, and none has been confirmed since, while the lease still holds (Chubby's
    /// "jeopardy", Curator's `SUSPENDED`). Work that must not outlive the lock, a leader's
    /// above all, can stop taking new work until it is safe again or lost. `false` once lost.
    #[must_use]
    pub fn is_at_risk(&self) -> bool {
        self.frame.lease.is_at_risk()
    }

    /// Resolves when the lease is at risk (see [`is_at_risk`](Self::is_at_risk)) or lost; at
    /// once if it already is.
    pub async fn at_risk(&self) {
        self.frame.lease.wait_risk(true).await;
    }

    /// Resolves when the lease is no longer at risk: a renewal was confirmed, or it is lost;
    /// at once if it is not at risk now.
    pub async fn out_of_risk(&self) {
        self.frame.lease.wait_risk(false).await;
    }

    /// Whether the work under this lock was asked to wind down: an election's leader asked to
    /// step down ([`Election::step_down`](crate::Election::step_down)), as a `leader = true`
    /// body sees it. Never for a lock.
    #[must_use]
    pub fn is_stepping_down(&self) -> bool {
        self.frame.lease.is_stepping_down()
    }

    /// Resolves when the work is asked to wind down (see
    /// [`is_stepping_down`](Self::is_stepping_down)) or the lease is over; at once if either
    /// already happened. A leader's loop `select!`s on it to stop taking new work.
    pub async fn stepping_down(&self) {
        self.frame.lease.stepping_down().await;
    }

    /// Resolves when the lease is over (see [`is_lost`](Self::is_lost)), with the error that
    /// says why ([`LostReason::Released`](crate::LostReason::Released) once it ended here).
    /// With `on_lost = "continue"`, a body can `select!` on this to stop at a safe point.
    pub async fn lost(&self) -> LockError {
        let reason = self.frame.lease.wait_lost().await;
        self.frame.lease.lost_error(reason)
    }
}

/// Whether the running task runs inside `lease`'s guarded body (at any depth).
pub(crate) fn runs_inside(lease: &Arc<Lease>) -> bool {
    FRAME
        .try_with(|frame| {
            let mut frame = Some(frame);
            while let Some(f) = frame {
                if Arc::ptr_eq(&f.lease, lease) {
                    return true;
                }
                frame = f.parent.as_ref();
            }
            false
        })
        .unwrap_or(false)
}

/// What the running task already holds, through one registry, of the keys it asks for.
pub(crate) enum Held {
    No,
    /// All of them, in this lease (a single key, or a multi-key lock that covers them).
    All(Arc<Lease>),
    /// This one, but not all of them in one lease.
    Some(String),
}

/// What the running task already holds of `keys` through `registry`.
pub(crate) fn held(registry: &Arc<RegistryInner>, keys: &[String]) -> Held {
    if keys.is_empty() {
        // Nothing to re-enter: the request fails on its own.
        return Held::No;
    }
    FRAME
        .try_with(|frame| {
            let mut some = None;
            let mut frame = Some(frame);
            while let Some(f) = frame {
                if Arc::ptr_eq(&f.registry, registry) {
                    let holds = |key: &String| f.lease.key.keys().iter().any(|k| k.name == *key);
                    if keys.iter().all(holds) {
                        return Held::All(f.lease.clone());
                    }
                    some = some.or_else(|| keys.iter().find(|k| holds(k)).cloned());
                }
                frame = f.parent.as_ref();
            }
            some.map_or(Held::No, Held::Some)
        })
        .unwrap_or(Held::No)
}

/// Why a task that holds a key as `held` cannot take it again as `asked` inside (`None`: it
/// re-enters what it holds). A writer may read or take a permit (it holds the key alone); a
/// reader or permit holder may not write: it would wait for itself, and two such upgraders
/// would wait for each other forever. `fenced`: whether the held lease has a fencing token, and
/// whether the request asks for one (a request that asks gets one, or an error).
pub(crate) fn cannot_reenter(held: Share, asked: Share, fenced: (bool, bool)) -> Option<String> {
    if fenced == (false, true) {
        return Some(
            "this task holds it without a fencing token and asks for one inside; take the \
             outer lock with `fencing = true`"
                .to_owned(),
        );
    }
    match (held, asked) {
        _ if held == asked => None,
        (Share::Exclusive, _) => None,
        (_, Share::Exclusive) => Some(format!(
            "this task holds {} on it, and taking the write lock inside would wait for itself \
             (two tasks doing so would wait for each other forever); release it first, or take \
             the write lock from the start",
            held.describe()
        )),
        _ => Some(format!(
            "this task holds {} on it and asks for {} inside; one key is taken one way",
            held.describe(),
            asked.describe()
        )),
    }
}

/// Runs `body` with `lease` as the innermost held lock.
pub(crate) fn scope<F: std::future::Future>(
    registry: Arc<RegistryInner>,
    lease: Arc<Lease>,
    body: F,
) -> tokio::task::futures::TaskLocalFuture<Arc<Frame>, F> {
    let parent = FRAME.try_with(Arc::clone).ok();
    FRAME.scope(
        Arc::new(Frame {
            registry,
            lease,
            parent,
        }),
        body,
    )
}
