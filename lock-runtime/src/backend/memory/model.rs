//! The in-memory store's model of the Redis protocol: the data the scripts keep in Redis (a
//! lock's string, the readers' and permits' sorted set, the waiters' queue and places, the
//! fencing counter) and the steps of the scripts over it, each saying which Lua it mirrors
//! (`backend/redis/scripts/`). A change to a script's behaviour changes its mirror here; the
//! conformance suite runs the same behaviours on both.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::contract::{Acquire, Attempt, Share, FENCE_EXPIRY_MS};
use crate::error::LockError;
use crate::key::LockKey;
use crate::waiting::Grant;

#[derive(Default)]
pub(super) struct Data {
    pub(super) locks: HashMap<String, Entry>,
    /// Semaphores, by key: their holders' leases, as the sorted set under the key in Redis.
    pub(super) pools: HashMap<String, Pool>,
    /// Each lock's waiters, oldest first, as `ACQUIRE_LUA` keeps them in Redis.
    pub(super) queues: HashMap<String, VecDeque<Waiter>>,
    pub(super) fences: HashMap<String, Fence>,
    /// The highest token this store ever handed out: a counter that expired restarts above it,
    /// as a Redis counter restarts above its predecessor from the server's clock.
    pub(super) highest_fence: u64,
    /// Expired counters are swept when the map reaches this size (then twice the live count),
    /// so memory stays bounded at an amortised constant cost per acquisition.
    pub(super) sweep_at: usize,
}

pub(super) struct Fence {
    pub(super) last: u64,
    pub(super) expires_at: Instant,
}

pub(super) struct Waiter {
    pub(super) token: String,
    pub(super) fencing: bool,
    /// Its place is dropped after this, unless an attempt renewed it.
    pub(super) deadline: Instant,
    /// The attempt that took or last kept the place.
    pub(super) place: u32,
    /// Standing aside (`Acquire::aside`): passed over by every handoff, its place kept.
    pub(super) aside: bool,
}

/// Who the lock went to in a handoff, for the notification sent once the data is unlocked.
pub(super) struct HandedOver {
    /// It went to the candidate named as the successor.
    pub(super) named: bool,
    pub(super) token: String,
    /// When the handed lock expires: with the waiter's place.
    pub(super) deadline: Instant,
    pub(super) grant: Grant,
}

pub(super) struct Entry {
    pub(super) token: String,
    pub(super) expires_at: Option<Instant>,
    /// When its holder took it (a holder asking again keeps it).
    pub(super) since: Instant,
}

/// Readers, or a semaphore's permit holders: what the key is, and each holder's lease.
pub(super) struct Pool {
    pub(super) share: Share,
    pub(super) holders: HashMap<String, Instant>,
}

impl Pool {
    /// When the first permit runs out, if none is released before.
    pub(super) fn soonest(&self) -> Option<Instant> {
        self.holders.values().min().copied()
    }
}

impl Data {
    /// The live entry under `key`, dropping it if it expired (Redis expires lazily too).
    pub(super) fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self
            .locks
            .get(key)
            .is_some_and(|e| e.expires_at.is_some_and(|t| t <= now))
        {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    /// When `token`'s hold of `key` began, if it holds it now (asking again keeps the count, as
    /// a renewal would); otherwise `now`, when a new hold begins.
    pub(super) fn held_since(&mut self, key: &str, token: &str, now: Instant) -> Instant {
        match self.live(key, now) {
            Some(entry) if entry.token == token => entry.since,
            _ => now,
        }
    }
}

impl Data {
    /// The semaphore under `key` with its live holders, dropping it once none is left
    /// (`live_shared` and `settle_shared` in `queue.lua`).
    pub(super) fn pool(&mut self, key: &str, now: Instant) -> Option<&mut Pool> {
        let pool = self.pools.get_mut(key)?;
        pool.holders.retain(|_, deadline| *deadline > now);
        if pool.holders.is_empty() {
            self.pools.remove(key);
        }
        self.pools.get_mut(key)
    }

    /// The place deadline of the oldest live waiter queued for `key` (stale places before it
    /// are dropped).
    pub(super) fn waiter_queued(&mut self, key: &str, now: Instant) -> Option<Instant> {
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

    /// A multi-key lock's attempt, as `acquire_all.lua` takes its keys: all or none, with one
    /// fencing token above every key's earlier ones, every counter raised to it.
    pub(super) fn take_all(&mut self, attempt: &Acquire<'_>, now: Instant) -> Attempt {
        let keys = attempt.key.keys();
        for (at, key) in keys.iter().enumerate() {
            if let Some(pool) = self.pool(&key.stored, now) {
                return Attempt::Busy {
                    retry_after: pool.soonest().map(|t| t - now),
                    holder: Some(pool.share.tag()),
                    at,
                };
            }
            if let Some(entry) = self.live(&key.stored, now) {
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
            let since = self.held_since(&key.stored, attempt.token, now);
            let entry = Entry {
                token: attempt.token.to_owned(),
                expires_at: Some(now + attempt.ttl),
                since,
            };
            self.locks.insert(key.stored.clone(), entry);
        }
        let fence = attempt.fencing.then(|| {
            let until = now + attempt.ttl;
            let fence = keys
                .iter()
                .map(|k| self.next_fence(&k.stored, now, until))
                .max()
                .unwrap_or(0);
            for key in keys {
                if let Some(counter) = self.fences.get_mut(&key.stored) {
                    counter.last = fence;
                }
            }
            fence
        });
        Attempt::Acquired { fence }
    }

    /// A reader's or a permit taker's attempt, as `acquire.lua`'s branch for a sorted set takes
    /// a place.
    pub(super) fn take_place(
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
        if let Some(entry) = self.live(&key.stored, now) {
            let busy = Attempt::Busy {
                retry_after: entry.expires_at.map(|t| t - now),
                holder: Some(entry.token.clone()),
                at: 0,
            };
            return Ok((busy, None));
        }
        match self.pool(&key.stored, now) {
            Some(pool) if pool.share != share => {
                return Err(share.mismatch(&key.name, "memory", pool.share));
            }
            Some(pool) if pool.holders.contains_key(attempt.token) => {}
            Some(pool) => {
                let held = pool.holders.len();
                let soonest = pool.soonest();
                let head = self.waiter_queued(&key.stored, now);
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
            .entry(key.stored.clone())
            .or_insert_with(|| Pool {
                share,
                holders: HashMap::new(),
            })
            .holders
            .insert(attempt.token.to_owned(), now + attempt.ttl);
        Ok((Attempt::Acquired { fence: None }, None))
    }

    /// Takes `token` out of `key`'s queue; whether it was there (`leave_queue` in `queue.lua`).
    pub(super) fn leave_queue(&mut self, key: &str, token: &str) -> bool {
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

    /// Takes or keeps `token`'s place in `key`'s queue, renewing it for one ttl (`acquire.lua`'s
    /// last lines, for a caller that queues up).
    pub(super) fn queue_up(&mut self, attempt: &Acquire<'_>, now: Instant) {
        let queue = self.queues.entry(attempt.key.stored.clone()).or_default();
        let deadline = now + attempt.ttl;
        match queue.iter_mut().find(|w| w.token == attempt.token) {
            Some(waiter) => {
                waiter.deadline = deadline;
                waiter.place = attempt.attempt;
                waiter.aside = attempt.aside;
            }
            None => queue.push_back(Waiter {
                token: attempt.token.to_owned(),
                fencing: attempt.fencing,
                deadline,
                place: attempt.attempt,
                aside: attempt.aside,
            }),
        }
    }

    /// Gives the free lock `key` to its oldest live waiter that does not stand aside, dropping
    /// the stale ones before it (`oldest_live_waiter` and `hand_over` in `queue.lua`).
    /// The lock expires with the waiter's place: a waiter that died in the queue keeps it no
    /// longer than its place had left.
    pub(super) fn hand_over(&mut self, key: &LockKey, now: Instant) -> Option<HandedOver> {
        self.hand_over_to(key, now, None)
    }

    /// As [`Self::hand_over`], but to the first live place of the candidate campaigning as
    /// `successor` where it is in line, leaving the places before it (`named_live_waiter` in
    /// `queue.lua`).
    pub(super) fn hand_over_to(
        &mut self,
        key: &LockKey,
        now: Instant,
        successor: Option<&str>,
    ) -> Option<HandedOver> {
        let queue = self.queues.get_mut(&key.stored)?;
        let named = successor.and_then(|successor| {
            queue.iter().position(|w| {
                w.deadline > now
                    && !w.aside
                    && crate::token::identity_of(&w.token) == Some(successor)
            })
        });
        let waiter = match named {
            Some(at) => queue.remove(at),
            None => {
                // The first place that may be handed the lock; the lapsed ones before it go, and
                // places standing aside stay.
                let first = queue.iter().position(|w| w.deadline > now && !w.aside);
                let waiter = first.and_then(|at| queue.remove(at));
                let before = first.unwrap_or(queue.len());
                let mut at = 0;
                queue.retain(|w| {
                    at += 1;
                    at > before || w.deadline > now
                });
                waiter
            }
        };
        if queue.is_empty() {
            self.queues.remove(&key.stored);
        }
        let waiter = waiter?;
        self.locks.insert(
            key.stored.clone(),
            Entry {
                token: waiter.token.clone(),
                expires_at: Some(waiter.deadline),
                since: now,
            },
        );
        let fence = if waiter.fencing {
            self.next_fence(&key.stored, now, waiter.deadline)
        } else {
            0
        };
        Some(HandedOver {
            named: named.is_some(),
            token: waiter.token,
            deadline: waiter.deadline,
            grant: Grant {
                fence,
                place: Some(waiter.place),
            },
        })
    }

    /// The counter's last fence, unless it expired.
    pub(super) fn live_fence(&self, fence_key: &str, now: Instant) -> Option<u64> {
        self.fences
            .get(fence_key)
            .filter(|f| f.expires_at > now)
            .map(|f| f.last)
    }

    /// The next token for `fence_key`, as `next_fence` and `keep_fence` in `prelude.lua`: the counter expires a day
    /// after the lease it was taken for (`held_until`), and a new one starts above every earlier
    /// token (this store's highest, where Redis has its clock: memory is never rolled back).
    pub(super) fn next_fence(&mut self, fence_key: &str, now: Instant, held_until: Instant) -> u64 {
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
    /// `hold_fence` in `prelude.lua` (`renew.lua`): kept a day beyond the lease once it has less than half a
    /// day beyond it, and put back at the holder's `fence` if it is gone, never lowered.
    pub(super) fn hold_fence(
        &mut self,
        fence_key: &str,
        fence: u64,
        now: Instant,
        held_until: Instant,
    ) {
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
