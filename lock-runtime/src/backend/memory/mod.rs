//! An in-process store with the same semantics as Redis, for unit tests and local runs. Its
//! model of the scripts is in `model`; here is the store's face.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::contract::{
    Acquire, Attempt, LockInfo, Place, Renewal, Renewed, Share, Store, FENCE_EXPIRY_MS,
};
use crate::error::LockError;
use crate::io::Home;
use crate::key::LockKey;
use crate::waiting::WaitHub;

mod model;
use model::{Data, Entry, HandedOver};

/// Locks kept in this process's memory.
///
/// One store shared by several registries behaves like one Redis shared by several replicas:
/// they exclude each other, queue up for each other's releases (which hand the lock to the
/// oldest live waiter) and share fencing counters. Time is
/// Tokio's clock, so tests under `tokio::time::pause()` can let leases expire instantly.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lock_runtime::{MemoryStore, Registry};
///
/// let store = MemoryStore::new();
/// let replica_a = Registry::builder().memory(store.clone()).build().unwrap();
/// let replica_b = Registry::builder().memory(store).build().unwrap();
///
/// let held = replica_a.lock("report:2026-11-22").acquire().await.unwrap();
/// assert!(replica_b.lock("report:2026-11-22").acquire().await.unwrap_err().is_busy());
/// held.release().await.unwrap();
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.inner.data().locks.len())
            .finish()
    }
}

struct Inner {
    data: Mutex<Data>,
    hub: WaitHub,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            data: Mutex::default(),
            hub: WaitHub::local(),
        }
    }
}

impl Inner {
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        // Every critical section is a few map operations that cannot panic halfway.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl MemoryStore {
    /// Releases one key, as `release.lua` does.
    fn release_key(&self, key: &LockKey, token: &str) -> bool {
        self.release_key_to(key, token, None).is_some()
    }

    /// Releases one key, handing it to the candidate `successor` where it is in line: whether
    /// it was ours (`None`: not), and whether it went to `successor`.
    fn release_key_to(&self, key: &LockKey, token: &str, successor: Option<&str>) -> Option<bool> {
        let now = Instant::now();
        let mut data = self.inner.data();
        let left = data.leave_queue(&key.stored, token);
        if let Some(pool) = data.pool(&key.stored, now) {
            if pool.holders.remove(token).is_none() {
                drop(data);
                if left {
                    // A waiter for the whole lock left: whoever it held off may enter.
                    self.inner.hub.notify(key.channel());
                }
                return None;
            }
            let handed = if data.pool(&key.stored, now).is_none() {
                data.hand_over(key, now)
            } else {
                None
            };
            drop(data);
            self.announce(key, handed);
            return Some(false);
        }
        let owner = data.live(&key.stored, now).map(|e| e.token == token);
        if owner != Some(true) {
            drop(data);
            if left && owner.is_none() {
                self.inner.hub.notify(key.channel());
            }
            return None;
        }
        data.locks.remove(&key.stored);
        let handed = data.hand_over_to(key, now, successor);
        drop(data);
        let named = handed.as_ref().is_some_and(|to| to.named);
        self.announce(key, handed);
        Some(named)
    }

    /// Tells the waiters a release happened: the lock went to `handed`, or it is free.
    fn announce(&self, key: &LockKey, handed: Option<HandedOver>) {
        match handed {
            Some(to) => self.inner.hub.hand_over(key.channel(), &to.token, to.grant),
            None => self.inner.hub.notify(key.channel()),
        }
    }

    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many callers wait for a release of `redis_key` (the full Redis name, prefix
    /// included) now, as `PUBSUB NUMSUB` counts a Redis server's listeners: for tests that must
    /// not release a lock before its waiter listens.
    #[must_use]
    pub fn waiters(&self, redis_key: &str) -> usize {
        self.inner.hub.interested(redis_key)
    }

    /// Sets `key` (the full Redis name, prefix included) to `value` with no expiry, as a foreign
    /// writer would: for tests that take a lock away behind its holder's back.
    pub fn overwrite(&self, redis_key: &str, value: &str) {
        self.inner.data().locks.insert(
            redis_key.to_owned(),
            Entry {
                token: value.to_owned(),
                expires_at: None,
                since: Instant::now(),
            },
        );
    }
}

impl Store for MemoryStore {
    fn node(&self) -> &str {
        "memory"
    }

    fn hub(&self) -> &WaitHub {
        &self.inner.hub
    }

    /// No I/O: background work runs on the caller's runtime.
    fn home(&self) -> Home {
        Home::Caller
    }

    fn offers_fencing(&self) -> bool {
        true
    }

    fn hands_over(&self) -> bool {
        true
    }

    fn stands_aside(&self) -> bool {
        true
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let now = Instant::now();
        let mut data = self.inner.data();
        let key = attempt.key;
        if attempt.key.is_multi() {
            return Ok(data.take_all(attempt, now));
        }
        if attempt.share.is_shared() {
            let (outcome, handed) = data.take_place(attempt, now)?;
            drop(data);
            if let Some(to) = handed {
                self.inner.hub.hand_over(key.channel(), &to.token, to.grant);
            }
            return Ok(outcome);
        }
        // Standing aside (the `aside` branch of `acquire.lua`): its place first, marked, so that
        // the handoff below passes it over.
        if attempt.aside {
            data.queue_up(attempt, now);
        }
        let mut handed = None;
        let pool = data
            .pool(&key.stored, now)
            .map(|p| (p.share.tag(), p.soonest()));
        let owner = match data.live(&key.stored, now) {
            Some(entry) => Some(entry.token.clone()),
            None if pool.is_some() => pool.as_ref().map(|(tag, _)| tag.clone()),
            // A free lock goes to the oldest live waiter, if that is not the caller.
            None => match data.hand_over(key, now) {
                Some(to) if to.token != attempt.token => {
                    let owner = to.token.clone();
                    handed = Some(to);
                    Some(owner)
                }
                Some(_) | None => None,
            },
        };
        let outcome = match owner {
            Some(owner) if owner != attempt.token => {
                if attempt.queue {
                    data.queue_up(attempt, now);
                }
                let expires_at = match &pool {
                    Some((_, soonest)) => *soonest,
                    None => data.live(&key.stored, now).and_then(|e| e.expires_at),
                };
                Attempt::Busy {
                    retry_after: expires_at.map(|t| t - now),
                    holder: Some(owner),
                    at: 0,
                }
            }
            // Free, and nobody in line may be handed it: standing aside, it stays free. (Its own
            // token holding the lock keeps it, as any attempt would: the candidate decides.)
            None if attempt.aside => Attempt::Busy {
                retry_after: None,
                holder: None,
                at: 0,
            },
            owner => {
                let again = owner.is_some_and(|o| o == attempt.token);
                let since = data.held_since(&key.stored, attempt.token, now);
                data.leave_queue(&key.stored, attempt.token);
                data.locks.insert(
                    key.stored.clone(),
                    Entry {
                        token: attempt.token.to_owned(),
                        expires_at: Some(now + attempt.ttl),
                        since,
                    },
                );
                // A holder asking again keeps its fence (see queue.lua's `own_fence`).
                let until = now + attempt.ttl;
                let fence = attempt
                    .fencing
                    .then(|| match data.live_fence(&key.stored, now) {
                        Some(fence) if again => {
                            if let Some(counter) = data.fences.get_mut(&key.stored) {
                                counter.expires_at = until + Duration::from_millis(FENCE_EXPIRY_MS);
                            }
                            fence
                        }
                        _ => data.next_fence(&key.stored, now, until),
                    });
                Attempt::Acquired { fence }
            }
        };
        drop(data);
        if let Some(to) = handed {
            self.inner.hub.hand_over(key.channel(), &to.token, to.grant);
        }
        Ok(outcome)
    }

    async fn release(&self, key: &LockKey, token: &str, _: Share) -> Result<bool, LockError> {
        // Every key is let go of, also after one that was not ours.
        let mut all = true;
        for key in key.keys() {
            all &= self.release_key(key, token);
        }
        Ok(all)
    }

    async fn release_to(
        &self,
        key: &LockKey,
        token: &str,
        successor: &str,
    ) -> Result<Option<bool>, LockError> {
        Ok(self.release_key_to(key, token, Some(successor)))
    }

    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        _budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        let now = Instant::now();
        let mut data = self.inner.data();
        Ok(batch
            .iter()
            .map(|r| {
                if let Some(pool) = data.pool(&r.key.stored, now) {
                    return match pool.holders.get_mut(r.token) {
                        Some(deadline) => {
                            *deadline = now + Duration::from_millis(r.ttl_ms);
                            Renewed::Yes
                        }
                        None => Renewed::Gone,
                    };
                }
                match data.live(&r.key.stored, now) {
                    Some(entry) if entry.token == r.token => {
                        let until = now + Duration::from_millis(r.ttl_ms);
                        entry.expires_at = Some(until);
                        if let Some(fence) = r.fence {
                            data.hold_fence(&r.key.stored, fence, now, until);
                        }
                        Renewed::Yes
                    }
                    Some(_) => Renewed::Taken,
                    None => Renewed::Gone,
                }
            })
            .map(Some)
            .collect())
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        let now = Instant::now();
        let mut data = self.inner.data();
        let queue: Vec<Place> = data
            .queues
            .get(&key.stored)
            .into_iter()
            .flatten()
            .filter(|w| w.deadline > now)
            .map(|w| Place::new(w.token.clone(), w.deadline - now).standing_aside(w.aside))
            .collect();
        let mut info = LockInfo {
            fence: data
                .fences
                .get(&key.stored)
                .filter(|f| f.expires_at > now)
                .map(|f| f.last),
            waiters: u32::try_from(queue.len()).unwrap_or(u32::MAX),
            queue,
            ..LockInfo::default()
        };
        if let Some(pool) = data.pool(&key.stored, now) {
            let holders = pool
                .holders
                .iter()
                .map(|(token, deadline)| Place::new(token.clone(), *deadline - now))
                .collect();
            info.held_shared(pool.share, holders);
        } else if let Some(entry) = data.live(&key.stored, now) {
            info.owner = Some(entry.token.clone());
            info.remaining = entry.expires_at.map(|t| t - now);
            info.held_for = Some(now - entry.since);
        }
        Ok(info)
    }

    async fn announce_taken(&self, key: &LockKey) -> Result<(), LockError> {
        self.inner.hub.taken(key.channel());
        Ok(())
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut data = self.inner.data();
        let existed =
            data.live(&key.stored, now).is_some() || data.pool(&key.stored, now).is_some();
        data.locks.remove(&key.stored);
        data.pools.remove(&key.stored);
        drop(data);
        if existed {
            self.inner.hub.notify(key.channel());
        }
        Ok(existed)
    }
}
