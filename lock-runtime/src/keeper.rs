//! The lease keeper: one task per registry that renews every held lock and finishes the
//! releases of dropped guards.
//!
//! Each renewal batch runs as a task of its own, with its own budget: a batch stuck on a slow
//! or silent node delays only the leases in it, never the planning of the others.
//!
//! A lock is renewed at a third of its ttl. Locks due within the next sixth of their ttl are
//! renewed early in the same batch, so however many locks a process holds, renewal costs a few
//! script calls per interval, not one command per lock. A renewal that fails is retried (never
//! turned into a delete); a lease whose deadline passes without a confirmed renewal, or whose
//! token Redis no longer holds, is marked lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{ttl_ms, Renewal, Renewed};
use crate::lease::Lease;
use crate::registry::RegistryInner;
use crate::LostReason;

/// Every lease this registry holds, and the keeper's schedule for each.
#[derive(Default)]
pub(crate) struct Leases {
    map: Mutex<HashMap<u64, Entry>>,
    /// Shared with the keeper task so it can sleep without keeping the registry alive.
    pub(crate) wake: Arc<Notify>,
    /// What the keeper sleeps towards; a new lease due earlier wakes it.
    next_wake: Mutex<Option<Instant>>,
    /// Whether a keeper task runs; cleared when it ends, also when the runtime it ran on is
    /// dropped (an in-memory registry's keeper runs on its callers' runtime).
    started: Arc<AtomicBool>,
}

struct Entry {
    lease: Arc<Lease>,
    next_renew: Option<Instant>,
    release: Release,
}

#[derive(PartialEq, Eq)]
enum Release {
    /// Held; renewed if the lease asks for it.
    No,
    /// Its owner is releasing it (or the keeper has handed it to a release task).
    InProgress,
    /// Dropped without a release: the keeper must release it.
    Requested,
}

struct Plan {
    renewals: Vec<Arc<Lease>>,
    releases: Vec<Arc<Lease>>,
    next: Option<Instant>,
}

impl Leases {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        // Entries are replaced whole; a panic elsewhere cannot leave one half-written.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, lease: Arc<Lease>, registry: &Arc<RegistryInner>) {
        let next_renew = lease
            .options
            .renew
            .then(|| lease.confirmed_at + lease.options.ttl / 3);
        self.map().insert(
            lease.id,
            Entry {
                lease,
                next_renew,
                release: Release::No,
            },
        );
        if !self.started.swap(true, Ordering::AcqRel) {
            let running = Running(self.started.clone());
            registry.spawn_background(keep(Arc::downgrade(registry), running));
        }
        if let Some(at) = next_renew {
            // Wake the keeper only if it would sleep past this lease's first renewal, and record
            // the earlier time at once, so a stream of short locks wakes it once per window
            // rather than once per acquisition.
            let mut sleeping_until = self
                .next_wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if sleeping_until.is_none_or(|t| at < t) {
                *sleeping_until = Some(at);
                self.wake.notify_one();
            }
        }
    }

    /// The owner is releasing: stop renewing, keep the entry until the server confirmed.
    pub(crate) fn begin_release(&self, id: u64) {
        if let Some(e) = self.map().get_mut(&id) {
            e.release = Release::InProgress;
        }
    }

    /// A guard was dropped or its release failed: the keeper releases it in the background.
    pub(crate) fn release_in_background(&self, id: u64) {
        if let Some(e) = self.map().get_mut(&id) {
            e.release = Release::Requested;
        }
        self.wake.notify_one();
    }

    pub(crate) fn remove(&self, id: u64) {
        self.map().remove(&id);
    }

    pub(crate) fn snapshot(&self) -> Vec<Arc<Lease>> {
        self.map().values().map(|e| e.lease.clone()).collect()
    }

    /// Takes every lease out of renewal for a shutdown.
    pub(crate) fn stop_all(&self) -> Vec<Arc<Lease>> {
        let mut map = self.map();
        map.values_mut()
            .map(|e| {
                e.release = Release::InProgress;
                e.lease.clone()
            })
            .collect()
    }

    fn reschedule(&self, id: u64, next_renew: Option<Instant>) {
        if let Some(e) = self.map().get_mut(&id) {
            if e.release == Release::No {
                e.next_renew = next_renew;
            }
        }
    }

    fn plan(&self, now: Instant) -> Plan {
        let mut plan = Plan {
            renewals: Vec::new(),
            releases: Vec::new(),
            next: None,
        };
        for entry in self.map().values_mut() {
            if entry.release == Release::Requested {
                entry.release = Release::InProgress;
                plan.releases.push(entry.lease.clone());
                continue;
            }
            if entry.release != Release::No {
                continue;
            }
            let Some(at) = entry.next_renew else { continue };
            let lease = &entry.lease;
            if let Some(reason) = lease.lost_reason() {
                lease.mark_lost(reason);
                entry.next_renew = None;
            } else if lease.max_hold_reached(now) {
                // The lease runs out on its own; its watchers report MaxHold at the deadline.
                entry.next_renew = None;
            } else if at <= now + lease.options.ttl / 6 {
                plan.renewals.push(lease.clone());
                // In flight: its batch reschedules it when it ends.
                entry.next_renew = None;
            } else {
                plan.next = Some(plan.next.map_or(at, |n| n.min(at)));
            }
        }
        plan
    }
}

/// Clears the keeper's `started` flag when the keeper's future is dropped, however that happens.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

async fn keep(registry: Weak<RegistryInner>, _running: Running) {
    let Some(wake) = registry.upgrade().map(|r| r.leases.wake.clone()) else {
        return;
    };
    loop {
        let until = {
            let Some(inner) = registry.upgrade() else {
                return;
            };
            let now = Instant::now();
            let plan = inner.leases.plan(now);
            for lease in plan.releases {
                inner.spawn_background(release_dropped(inner.clone(), lease));
            }
            if !plan.renewals.is_empty() {
                let batch = inner.clone();
                inner.spawn_background(async move {
                    renew(&batch, &plan.renewals, now).await;
                    batch.leases.wake.notify_one();
                });
            }
            *inner
                .leases
                .next_wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = plan.next;
            plan.next.unwrap_or(now + Duration::from_secs(3600))
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = wake.notified() => {}
        }
    }
}

async fn renew(inner: &RegistryInner, leases: &[Arc<Lease>], sent_at: Instant) {
    let batch: Vec<Renewal<'_>> = leases
        .iter()
        .map(|l| Renewal {
            redis_key: &l.key.redis_key,
            token: &l.token,
            ttl_ms: ttl_ms(l.options.ttl),
        })
        .collect();
    // Waiting longer than a third of the shortest ttl would only delay the retries.
    let budget = leases
        .iter()
        .map(|l| l.options.ttl / 3)
        .min()
        .unwrap_or(Duration::from_secs(1));
    // The backend bounds each node's part by `budget`; the outer bound only catches a stuck
    // connect.
    let outcome = tokio::time::timeout(budget * 2, inner.backend.renew(&batch, budget)).await;
    match outcome {
        Ok(Ok(renewed)) => {
            let now = Instant::now();
            for (lease, outcome) in leases.iter().zip(renewed) {
                match outcome {
                    Some(Renewed::Yes) => {
                        lease.confirm_renewal(sent_at);
                        inner
                            .leases
                            .reschedule(lease.id, Some(sent_at + lease.options.ttl / 3));
                    }
                    Some(Renewed::Gone) => {
                        lease.mark_lost(LostReason::Gone);
                        inner.leases.reschedule(lease.id, None);
                    }
                    Some(Renewed::Taken) => {
                        lease.mark_lost(LostReason::Stolen);
                        inner.leases.reschedule(lease.id, None);
                    }
                    None => inner
                        .leases
                        .reschedule(lease.id, Some(now + retry_delay(lease))),
                }
            }
            tracing::trace!(
                locks = leases.len(),
                elapsed_us = u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX),
                "renewed"
            );
        }
        failure => {
            let error = match failure {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {budget:?}"),
            };
            tracing::warn!(
                node = inner.backend.node(),
                locks = leases.len(),
                %error,
                "lock renewal failed; retrying before the leases' deadlines"
            );
            let now = Instant::now();
            for lease in leases {
                inner
                    .leases
                    .reschedule(lease.id, Some(now + retry_delay(lease)));
            }
        }
    }
}

/// Retries come often enough for several tries before the deadline (ttl/3 ahead).
fn retry_delay(lease: &Lease) -> Duration {
    (lease.options.ttl / 12).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// Releases a lock whose guard was dropped, retrying until the server confirms or the lock
/// has certainly expired on its own.
async fn release_dropped(inner: Arc<RegistryInner>, lease: Arc<Lease>) {
    let give_up = lease.state().deadline + lease.options.ttl;
    let mut delay = Duration::from_millis(10);
    loop {
        match inner.backend.release(&lease.key, &lease.token).await {
            Ok(released) => {
                tracing::debug!(
                    key = %crate::error::shown(&lease.key.key),
                    released,
                    "lock released in the background"
                );
                break;
            }
            Err(error) => {
                if Instant::now() + delay >= give_up {
                    tracing::warn!(%error, "giving up releasing a dropped lock; it expires by its ttl");
                    break;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
    inner.leases.remove(lease.id);
}
