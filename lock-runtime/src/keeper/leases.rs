//! The table of leases a registry holds, and the keeper's schedule for each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::error::LostReason;
use crate::lease::Lease;

/// Every lease this registry holds, and the keeper's schedule for each.
#[derive(Default)]
pub(super) struct Leases {
    map: Mutex<HashMap<u64, Entry>>,
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

/// What the keeper does next: renew these, release those, then sleep until `next`.
pub(super) struct Plan {
    pub renewals: Vec<Arc<Lease>>,
    pub releases: Vec<Arc<Lease>>,
    /// Past their deadline: the keeper marks them lost, outside the table's lock (marking
    /// records a metric, the application's code).
    pub lost: Vec<(Arc<Lease>, LostReason)>,
    pub next: Option<Instant>,
}

impl Leases {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        // Entries are replaced whole; a panic elsewhere cannot leave one half-written.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a lease; returns when it is first due for renewal (`None`: never): a third into
    /// the lease, which may be at once for a lock handed over late in its waiter's place.
    pub(super) fn insert(&self, lease: Arc<Lease>) -> Option<Instant> {
        let next_renew = lease
            .options
            .renew
            .then(|| lease.started_at + lease.options.ttl / 3);
        lease.labels.holding();
        self.map().insert(
            lease.id,
            Entry {
                lease,
                next_renew,
                release: Release::No,
            },
        );
        next_renew
    }

    /// The owner is releasing: stop renewing, keep the entry until the server confirmed.
    pub(super) fn begin_release(&self, id: u64) {
        if let Some(e) = self.map().get_mut(&id) {
            e.release = Release::InProgress;
        }
    }

    /// A guard was dropped or its release failed: the keeper releases it in the background.
    pub(super) fn request_release(&self, id: u64) {
        if let Some(e) = self.map().get_mut(&id) {
            e.release = Release::Requested;
        }
    }

    /// The leases whose guards were dropped and whose release no task has taken up yet, taken
    /// out of the table: what a keeper that is going away must still let go of.
    pub(super) fn take_requested(&self) -> Vec<Arc<Lease>> {
        self.map()
            .extract_if(|_, e| e.release == Release::Requested)
            .map(|(_, e)| e.lease)
            .collect()
    }

    /// Forgets a lease: it is no longer held (released, or let go of after its loss).
    pub(super) fn remove(&self, id: u64) {
        let removed = self.map().remove(&id);
        if let Some(entry) = removed {
            entry.lease.labels.ended(entry.lease.confirmed_at.elapsed());
        }
    }

    pub(super) fn snapshot(&self) -> Vec<Arc<Lease>> {
        self.map().values().map(|e| e.lease.clone()).collect()
    }

    /// Takes every lease out of renewal for a shutdown.
    pub(super) fn stop_all(&self) -> Vec<Arc<Lease>> {
        let mut map = self.map();
        map.values_mut()
            .map(|e| {
                e.release = Release::InProgress;
                e.lease.clone()
            })
            .collect()
    }

    /// Whether the lease is still held and renewed: not gone, and its owner not releasing it.
    pub(super) fn renewing(&self, id: u64) -> bool {
        self.map()
            .get(&id)
            .is_some_and(|e| e.release == Release::No)
    }

    pub(super) fn reschedule(&self, id: u64, next_renew: Option<Instant>) {
        if let Some(e) = self.map().get_mut(&id) {
            if e.release == Release::No {
                e.next_renew = next_renew;
            }
        }
    }

    pub(super) fn plan(&self, now: Instant) -> Plan {
        let mut plan = Plan {
            renewals: Vec::new(),
            releases: Vec::new(),
            lost: Vec::new(),
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
            let lease = &entry.lease;
            let Some(at) = entry.next_renew else {
                // Not renewed (renewal off, `max_hold` reached, or a renewal in flight): lost at
                // its deadline unless a renewal moves it, so that a lease nobody watches is
                // reported (and counted) lost too.
                let state = lease.state();
                if state.lost.is_none() {
                    if let Some(reason) = lease.lost_reason() {
                        plan.lost.push((lease.clone(), reason));
                    } else {
                        plan.next =
                            Some(plan.next.map_or(state.deadline, |n| n.min(state.deadline)));
                    }
                }
                continue;
            };
            if let Some(reason) = lease.lost_reason() {
                plan.lost.push((lease.clone(), reason));
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
