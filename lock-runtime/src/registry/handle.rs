//! The registry handle: where locks are taken, inspected and force-unlocked, and how a
//! process gives its locks back when it stops.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::backend::{LockInfo, Store};
use crate::election::Election;
use crate::lock::LockRequest;
use crate::options::Share;
use crate::state::RegistryInner;
use crate::{error::LockError, error::LostReason};

/// A place to take locks: one backend (a Redis server, or memory), a key prefix, and the lease
/// keeper that renews what this process holds there. Cheap to clone; clones share everything.
///
/// The connections, the keeper and the notification subscriber are started on first use. For
/// Redis they run on the library's own I/O thread, while callers send on the connections from
/// their own tasks, so one registry serves every Tokio runtime of the process, one after the
/// other or at the same time (one per `#[tokio::test]`).
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<RegistryInner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The node is `host:port`: credentials never reach Debug output.
        self.inner.fmt(f)
    }
}

/// A lock this process holds, as listed by [`Registry::held`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    /// The key as given.
    pub key: String,
    /// The fencing token, if taken with fencing.
    pub fence: Option<u64>,
    /// How long it has been held.
    pub held_for: Duration,
    /// Whether the lease is lost.
    pub lost: bool,
}

impl Registry {
    /// Starts a lock request for `key` (the prefix is added for you).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let registry = lock_runtime::Registry::in_memory();
    /// let guard = registry
    ///     .lock("deploy:42")
    ///     .ttl(Duration::from_secs(60))
    ///     .wait(Duration::from_secs(5))
    ///     .acquire()
    ///     .await?;
    /// assert_eq!(guard.redis_key(), "lock:deploy:42");
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.inner.clone(), vec![key.into()])
    }

    /// Starts a request for one lock over several keys, taken all or none, in one step (one
    /// script on one node): money moved between two accounts, stock between two warehouses.
    /// The keys are sorted, so two requests for the same keys never wait for each other in
    /// turn, and repeats count once. Exclusive only (no `mode(Mode::Read)` or `permits`); with
    /// `fencing`, one token above every earlier token of each key.
    ///
    /// In Redis Cluster the keys must share a hash tag (`{accounts}:7`, `{accounts}:9`), else
    /// the request fails with [`LockError::InvalidKey`] naming that fix; on Redlock every key
    /// is taken on a quorum. A multi-key acquisition does not queue: it waits for a release
    /// notification of the key it found taken, and is not served first come, first served. At
    /// most [`MAX_KEYS_PER_LOCK`](crate::MAX_KEYS_PER_LOCK) keys: one script takes them all
    /// while the server waits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = lock_runtime::Registry::in_memory();
    /// let both = registry.lock_all(["account:9", "account:7"]).acquire().await?;
    /// assert_eq!(both.key(), "account:7 + account:9");
    /// assert!(registry.lock("account:9").acquire().await.unwrap_err().is_busy());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I, K>(&self, keys: I) -> LockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        LockRequest::new(
            self.inner.clone(),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// An election on `key`: candidates [`campaign`](Election::campaign) for it (or
    /// [`lead`](Election::lead) whenever elected), and anyone can ask who leads or
    /// [`observe`](Election::observe) it. The key is the election's alone: a lock request
    /// that finds a leader there, or a candidate that finds a lock, fails with
    /// [`LockError::InvalidOptions`].
    pub fn election(&self, key: impl Into<String>) -> Election {
        Election::new(self.inner.clone(), key.into())
    }

    /// The Redis key that holds `key`'s lock.
    #[must_use]
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The node this registry talks to, as `host:port` (or `memory`).
    #[must_use]
    pub fn node(&self) -> &str {
        self.inner.backend.node()
    }

    /// Who holds `key` now, for how much longer, and its last fencing token.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        self.inner.backend.inspect(&key).await
    }

    /// Deletes `key`'s lock whoever holds it, and wakes its waiters. For operators: the holder
    /// notices at its next renewal and, with `on_lost = "cancel"`, stops. Returns whether a lock
    /// was there.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        let existed = self.inner.backend.force_unlock(&key).await?;
        tracing::warn!(key = %crate::error::shown(&key.name), existed, "lock force-unlocked");
        Ok(existed)
    }

    /// Releases `key`'s lock only if `owner` (a token as shown by [`inspect`](Self::inspect))
    /// still holds it, as its owner's release would: the oldest queued waiter gets it, or it is
    /// deleted and waiters wake. An operator's force-unlock that cannot remove a lock that
    /// changed hands after they looked. Returns whether `owner` held it. On Redlock it returns
    /// once every node answered (or timed out), not at the first majority as a holder's release
    /// does: a process that exits right after (`lockctl unlock`) leaves no node's copy behind.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn force_unlock_owned_by(&self, key: &str, owner: &str) -> Result<bool, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        // How `owner` holds it is not known here: a lock held shared is released by the
        // script all the same.
        let deleted = self
            .inner
            .backend
            .release_everywhere(&key, owner, Share::Exclusive)
            .await?;
        tracing::warn!(key = %crate::error::shown(&key.name), deleted, "lock force-unlocked (owner-checked)");
        Ok(deleted)
    }

    /// The locks this process holds through this registry.
    #[must_use]
    pub fn held(&self) -> Vec<HeldLock> {
        self.inner
            .keeper
            .snapshot()
            .into_iter()
            .map(|lease| HeldLock {
                key: lease.key.name.clone(),
                fence: lease.fence,
                held_for: lease.confirmed_at.elapsed(),
                lost: lease.lost_reason().is_some(),
            })
            .collect()
    }

    /// Graceful shutdown: marks every held lease lost (guarded bodies with `on_lost = "cancel"`
    /// stop) and releases every lock on the server, each as soon as the body it guarded is
    /// gone: a body that does not yield (it blocks its thread) keeps its key until it ends or
    /// its lease runs out, so it never overlaps the next holder. Each release waits at most the
    /// connect timeout plus the command timeout (enough for one reconnection and one round of
    /// releases). Returns how many held locks are no longer held on the server afterwards
    /// (released here, or by their own body as it stopped); a lock whose release failed or did
    /// not finish in time is left to expire by its ttl and not counted.
    ///
    /// Called from inside a body that this registry guards, under `on_lost = "cancel"`, it
    /// stops that body (and with it the shutdown's own future: the keeper finishes the
    /// releases); under `"continue"`, it waits for that body until its lease runs out.
    ///
    /// Afterwards this registry and all its clones take no new locks: acquisitions fail with
    /// [`LockError::ShutDown`], and one already waiting for a busy lock (an election's
    /// campaign too) fails at once, leaving the queue (one handed the lock meanwhile gives it
    /// back). [`inspect`](Self::inspect) and the force-unlocks still
    /// work. A process that must keep locking builds a new registry.
    pub async fn shutdown(&self) -> usize {
        self.inner.close();
        let leases = self.inner.keeper.stop_all();
        for lease in &leases {
            lease.mark_lost(LostReason::Shutdown);
        }
        // A caller that stops waiting leaves the releases to the keeper, which lists each
        // lease until its release is done.
        let mut unfinished = Unfinished {
            keeper: &self.inner.keeper,
            leases: &leases,
            armed: true,
        };
        let (released, late) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let bound = self.inner.timeouts.round();
        let releases = leases.iter().map(|lease| async {
            lease.body_gone().await;
            let release = lease.give_back(&self.inner.backend);
            match tokio::time::timeout(bound, release).await {
                // `Ok(false)`: not ours any more, which is what shutdown wants too.
                Ok(Ok(_)) => drop(released.fetch_add(1, Ordering::Relaxed)),
                Ok(Err(_)) => {}
                Err(_) => drop(late.fetch_add(1, Ordering::Relaxed)),
            }
        });
        join_all(releases).await;
        let late = late.into_inner();
        if late > 0 {
            tracing::warn!(
                node = %self.node(),
                locks = late,
                "shutdown gave up waiting for releases after {bound:?}; they expire by their ttl"
            );
        }
        unfinished.armed = false;
        for lease in &leases {
            self.inner.keeper.remove(lease.id);
        }
        released.into_inner()
    }
}

/// A shutdown's leases, handed to the keeper to release in the background if the shutdown is
/// dropped before it finished.
struct Unfinished<'a> {
    keeper: &'a crate::keeper::Keeper,
    leases: &'a [Arc<crate::lease::Lease>],
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            for lease in self.leases {
                self.keeper.release_in_background(lease.id);
            }
        }
    }
}
