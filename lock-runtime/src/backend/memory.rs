//! An in-process store with the same semantics as Redis, for unit tests and local runs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::contract::{
    Acquire, Attempt, LockInfo, Permits, Place, Renewal, Renewed, Share, Store, FENCE_EXPIRY_MS,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::waiting::{Grant, WaitHub};

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

#[derive(Default)]
struct Data {
    locks: HashMap<String, Entry>,
    /// Semaphores, by key: their holders' leases, as the sorted set under the key in Redis.
    pools: HashMap<String, Pool>,
    /// Each lock's waiters, oldest first, as `ACQUIRE_LUA` keeps them in Redis.
    queues: HashMap<String, VecDeque<Waiter>>,
    fences: HashMap<String, Fence>,
    /// The highest token this store ever handed out: a counter that expired restarts above it,
    /// as a Redis counter restarts above its predecessor from the server's clock.
    highest_fence: u64,
    /// Expired counters are swept when the map reaches this size (then twice the live count),
    /// so memory stays bounded at an amortised constant cost per acquisition.
    sweep_at: usize,
}

struct Fence {
    last: u64,
    expires_at: Instant,
}

struct Waiter {
    token: String,
    fencing: bool,
    /// Its place is dropped after this, unless an attempt renewed it.
    deadline: Instant,
    /// The attempt that took or last kept the place.
    place: u32,
}

/// Who the lock went to in a handoff, for the notification sent once the data is unlocked.
struct HandedOver {
    token: String,
    /// When the handed lock expires: with the waiter's place.
    deadline: Instant,
    grant: Grant,
}

struct Entry {
    token: String,
    expires_at: Option<Instant>,
}

/// Readers, or a semaphore's permit holders: what the key is, and each holder's lease.
struct Pool {
    share: Share,
    holders: HashMap<String, Instant>,
}

impl Pool {
    /// When the first permit runs out, if none is released before.
    fn soonest(&self) -> Option<Instant> {
        self.holders.values().min().copied()
    }
}

impl Inner {
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        // Every critical section is a few map operations that cannot panic halfway.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Data {
    /// The live entry under `key`, dropping it if it expired (Redis expires lazily too).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self
            .locks
            .get(key)
            .is_some_and(|e| e.expires_at.is_some_and(|t| t <= now))
        {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }
}

impl Data {
    /// The semaphore under `key` with its live holders, dropping it once none is left.
    fn pool(&mut self, key: &str, now: Instant) -> Option<&mut Pool> {
        let pool = self.pools.get_mut(key)?;
        pool.holders.retain(|_, deadline| *deadline > now);
        if pool.holders.is_empty() {
            self.pools.remove(key);
        }
        self.pools.get_mut(key)
    }

    /// Whether a live waiter is queued for `key` (stale places before it are dropped).
    /// The place deadline of the oldest live waiter queued for `key` (stale places before it
    /// are dropped).
    fn waiter_queued(&mut self, key: &str, now: Instant) -> Option<Instant> {
        let queue = self.queues.get_mut(key)?;
        while queue.front().is_some_and(|w| w.deadline <= now) {
            queue.pop_front();
        }
        let head = queue.front().map(|w| w.deadline);
        if head.is_none() {
            self.queues.remove(key);
        }
        head
    }

    /// A multi-key lock's attempt, as `ACQUIRE_ALL_LUA` takes its keys: all or none, with one
    /// fencing token above every key's earlier ones, every counter raised to it.
    fn take_all(&mut self, attempt: &Acquire<'_>, now: Instant) -> Attempt {
        let keys = attempt.key.keys();
        for (at, key) in keys.iter().enumerate() {
            if let Some(pool) = self.pool(&key.redis_key, now) {
                return Attempt::Busy {
                    retry_after: pool.soonest().map(|t| t - now),
                    holder: Some(pool.share.tag()),
                    at,
                };
            }
            if let Some(entry) = self.live(&key.redis_key, now) {
                if entry.token != attempt.token {
                    return Attempt::Busy {
                        retry_after: entry.expires_at.map(|t| t - now),
                        holder: Some(entry.token.clone()),
                        at,
                    };
                }
            }
        }
        for key in keys {
            let entry = Entry {
                token: attempt.token.to_owned(),
                expires_at: Some(now + attempt.ttl),
            };
            self.locks.insert(key.redis_key.clone(), entry);
        }
        let fence = attempt.fencing.then(|| {
            let until = now + attempt.ttl;
            let fence = keys
                .iter()
                .map(|k| self.next_fence(&k.fence_key, now, until))
                .max()
                .unwrap_or(0);
            for key in keys {
                if let Some(counter) = self.fences.get_mut(&key.fence_key) {
                    counter.last = fence;
                }
            }
            fence
        });
        Attempt::Acquired { fence }
    }

    /// A reader's or a permit taker's attempt, as `ACQUIRE_LUA` takes a place.
    fn take_place(
        &mut self,
        attempt: &Acquire<'_>,
        now: Instant,
    ) -> Result<(Attempt, Option<HandedOver>), LockError> {
        let share = attempt.share;
        let limit = match share {
            Share::Permits(n) => n as usize,
            Share::Read | Share::Exclusive => usize::MAX,
        };
        let key = attempt.key;
        if let Some(entry) = self.live(&key.redis_key, now) {
            let busy = Attempt::Busy {
                retry_after: entry.expires_at.map(|t| t - now),
                holder: Some(entry.token.clone()),
                at: 0,
            };
            return Ok((busy, None));
        }
        match self.pool(&key.redis_key, now) {
            Some(pool) if pool.share != share => {
                return Err(share.mismatch(&key.name, "memory", pool.share));
            }
            Some(pool) if pool.holders.contains_key(attempt.token) => {}
            Some(pool) => {
                let held = pool.holders.len();
                let soonest = pool.soonest();
                let head = self.waiter_queued(&key.redis_key, now);
                if held >= limit || head.is_some() {
                    let wait = soonest.into_iter().chain(head).min();
                    let busy = Attempt::Busy {
                        retry_after: wait.map(|t| t - now),
                        holder: Some(share.tag()),
                        at: 0,
                    };
                    return Ok((busy, None));
                }
            }
            None => {
                if let Some(to) = self.hand_over(key, now) {
                    let busy = Attempt::Busy {
                        retry_after: Some(to.deadline - now),
                        holder: Some(to.token.clone()),
                        at: 0,
                    };
                    return Ok((busy, Some(to)));
                }
            }
        }
        self.pools
            .entry(key.redis_key.clone())
            .or_insert_with(|| Pool {
                share,
                holders: HashMap::new(),
            })
            .holders
            .insert(attempt.token.to_owned(), now + attempt.ttl);
        Ok((Attempt::Acquired { fence: None }, None))
    }

    /// Takes `token` out of `key`'s queue; whether it was there.
    fn leave_queue(&mut self, key: &str, token: &str) -> bool {
        let Some(queue) = self.queues.get_mut(key) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|w| w.token != token);
        let left = queue.len() < before;
        if queue.is_empty() {
            self.queues.remove(key);
        }
        left
    }

    /// Takes or keeps `token`'s place in `key`'s queue, renewing it for one ttl.
    fn queue_up(&mut self, attempt: &Acquire<'_>, now: Instant) {
        let queue = self
            .queues
            .entry(attempt.key.redis_key.clone())
            .or_default();
        let deadline = now + attempt.ttl;
        match queue.iter_mut().find(|w| w.token == attempt.token) {
            Some(waiter) => {
                waiter.deadline = deadline;
                waiter.place = attempt.attempt;
            }
            None => queue.push_back(Waiter {
                token: attempt.token.to_owned(),
                fencing: attempt.fencing,
                deadline,
                place: attempt.attempt,
            }),
        }
    }

    /// Gives the free lock `key` to its oldest live waiter, dropping the stale ones before it.
    /// The lock expires with the waiter's place: a waiter that died in the queue keeps it no
    /// longer than its place had left.
    fn hand_over(&mut self, key: &LockKey, now: Instant) -> Option<HandedOver> {
        let queue = self.queues.get_mut(&key.redis_key)?;
        let waiter = std::iter::from_fn(|| queue.pop_front()).find(|w| w.deadline > now);
        if queue.is_empty() {
            self.queues.remove(&key.redis_key);
        }
        let waiter = waiter?;
        self.locks.insert(
            key.redis_key.clone(),
            Entry {
                token: waiter.token.clone(),
                expires_at: Some(waiter.deadline),
            },
        );
        let fence = if waiter.fencing {
            self.next_fence(&key.fence_key, now, waiter.deadline)
        } else {
            0
        };
        Some(HandedOver {
            token: waiter.token,
            deadline: waiter.deadline,
            grant: Grant {
                fence,
                place: Some(waiter.place),
            },
        })
    }

    /// The counter's last fence, unless it expired.
    fn live_fence(&self, fence_key: &str, now: Instant) -> Option<u64> {
        self.fences
            .get(fence_key)
            .filter(|f| f.expires_at > now)
            .map(|f| f.last)
    }

    /// The next token for `fence_key`, with the same rules as Redis: the counter expires a day
    /// after the lease it was taken for (`held_until`), and a new one starts above every earlier
    /// token (this store's highest, where Redis has its clock: memory is never rolled back).
    fn next_fence(&mut self, fence_key: &str, now: Instant, held_until: Instant) -> u64 {
        let expires_at = held_until + Duration::from_millis(FENCE_EXPIRY_MS);
        let fence = match self.fences.get_mut(fence_key) {
            Some(f) if f.expires_at > now => {
                f.last += 1;
                f.expires_at = expires_at;
                f.last
            }
            _ => {
                if self.fences.len() >= self.sweep_at {
                    self.fences.retain(|_, f| f.expires_at > now);
                    self.sweep_at = (2 * self.fences.len()).max(64);
                }
                let last = self.highest_fence + 1;
                self.fences
                    .insert(fence_key.to_owned(), Fence { last, expires_at });
                last
            }
        };
        self.highest_fence = self.highest_fence.max(fence);
        fence
    }

    /// A held fenced lock's counter at a renewal of its lease (until `held_until`), as the
    /// Redis scripts' `hold_fence`: kept a day beyond the lease once it has less than half a
    /// day beyond it, and put back at the holder's `fence` if it is gone, never lowered.
    fn hold_fence(&mut self, fence_key: &str, fence: u64, now: Instant, held_until: Instant) {
        let day = Duration::from_millis(FENCE_EXPIRY_MS);
        match self.fences.get_mut(fence_key) {
            Some(f) if f.expires_at > now => {
                if f.expires_at < held_until + day / 2 {
                    f.expires_at = held_until + day;
                    f.last = f.last.max(fence);
                }
            }
            _ => {
                let expires_at = held_until + day;
                self.fences.insert(
                    fence_key.to_owned(),
                    Fence {
                        last: fence,
                        expires_at,
                    },
                );
                self.highest_fence = self.highest_fence.max(fence);
            }
        }
    }
}

impl MemoryStore {
    /// Releases one key, as `RELEASE_LUA` does.
    fn release_key(&self, key: &LockKey, token: &str) -> bool {
        let now = Instant::now();
        let mut data = self.inner.data();
        let left = data.leave_queue(&key.redis_key, token);
        if let Some(pool) = data.pool(&key.redis_key, now) {
            if pool.holders.remove(token).is_none() {
                drop(data);
                if left {
                    // A waiter for the whole lock left: whoever it held off may enter.
                    self.inner.hub.notify(key.channel());
                }
                return false;
            }
            let handed = if data.pool(&key.redis_key, now).is_none() {
                data.hand_over(key, now)
            } else {
                None
            };
            drop(data);
            self.announce(key, handed);
            return true;
        }
        let owner = data.live(&key.redis_key, now).map(|e| e.token == token);
        if owner != Some(true) {
            drop(data);
            if left && owner.is_none() {
                self.inner.hub.notify(key.channel());
            }
            return false;
        }
        data.locks.remove(&key.redis_key);
        let handed = data.hand_over(key, now);
        drop(data);
        self.announce(key, handed);
        true
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
        let mut handed = None;
        let pool = data
            .pool(&key.redis_key, now)
            .map(|p| (p.share.tag(), p.soonest()));
        let owner = match data.live(&key.redis_key, now) {
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
                    None => data.live(&key.redis_key, now).and_then(|e| e.expires_at),
                };
                Attempt::Busy {
                    retry_after: expires_at.map(|t| t - now),
                    holder: Some(owner),
                    at: 0,
                }
            }
            owner => {
                let again = owner.is_some_and(|o| o == attempt.token);
                data.leave_queue(&key.redis_key, attempt.token);
                data.locks.insert(
                    key.redis_key.clone(),
                    Entry {
                        token: attempt.token.to_owned(),
                        expires_at: Some(now + attempt.ttl),
                    },
                );
                // A holder asking again keeps its fence (see queue.lua's `own_fence`).
                let until = now + attempt.ttl;
                let fence = attempt
                    .fencing
                    .then(|| match data.live_fence(&key.fence_key, now) {
                        Some(fence) if again => {
                            if let Some(counter) = data.fences.get_mut(&key.fence_key) {
                                counter.expires_at = until + Duration::from_millis(FENCE_EXPIRY_MS);
                            }
                            fence
                        }
                        _ => data.next_fence(&key.fence_key, now, until),
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
                if let Some(pool) = data.pool(r.redis_key, now) {
                    return match pool.holders.get_mut(r.token) {
                        Some(deadline) => {
                            *deadline = now + Duration::from_millis(r.ttl_ms);
                            Renewed::Yes
                        }
                        None => Renewed::Gone,
                    };
                }
                match data.live(r.redis_key, now) {
                    Some(entry) if entry.token == r.token => {
                        let until = now + Duration::from_millis(r.ttl_ms);
                        entry.expires_at = Some(until);
                        if let Some((counter, fence)) = r.fence {
                            data.hold_fence(counter, fence, now, until);
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
            .get(&key.redis_key)
            .into_iter()
            .flatten()
            .filter(|w| w.deadline > now)
            .map(|w| Place::new(w.token.clone(), w.deadline - now))
            .collect();
        let mut info = LockInfo {
            fence: data
                .fences
                .get(&key.fence_key)
                .filter(|f| f.expires_at > now)
                .map(|f| f.last),
            waiters: u32::try_from(queue.len()).unwrap_or(u32::MAX),
            queue,
            ..LockInfo::default()
        };
        if let Some(pool) = data.pool(&key.redis_key, now) {
            let held = u32::try_from(pool.holders.len()).unwrap_or(u32::MAX);
            info.remaining = pool.holders.values().max().map(|t| *t - now);
            info.holders = pool
                .holders
                .iter()
                .map(|(token, deadline)| Place::new(token.clone(), *deadline - now))
                .collect();
            info.holders.sort_by_key(|p| std::cmp::Reverse(p.remaining));
            info.permits = match pool.share {
                Share::Permits(total) => Some(Permits { held, total }),
                Share::Read | Share::Exclusive => None,
            };
            info.readers = (pool.share == Share::Read).then_some(held);
        } else if let Some(entry) = data.live(&key.redis_key, now) {
            info.owner = Some(entry.token.clone());
            info.remaining = entry.expires_at.map(|t| t - now);
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
            data.live(&key.redis_key, now).is_some() || data.pool(&key.redis_key, now).is_some();
        data.locks.remove(&key.redis_key);
        data.pools.remove(&key.redis_key);
        drop(data);
        if existed {
            self.inner.hub.notify(key.channel());
        }
        Ok(existed)
    }
}
