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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Renewal, Renewed, Store};
use crate::backoff::Backoff;
use crate::error::LostReason;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics::RenewalOutcome;
use crate::options::Share;
use crate::report;

mod leases;

use leases::Leases;

/// A registry's lease keeper: the leases it holds, and the task that keeps them.
pub(crate) struct Keeper {
    backend: Arc<Backend>,
    leases: Leases,
    /// Shared with the keeper task so it can sleep without keeping the keeper alive.
    wake: Arc<Notify>,
    /// What the keeper sleeps towards; a new lease due earlier wakes it.
    next_wake: Mutex<Option<Instant>>,
    /// Whether a keeper task runs; cleared when it ends, also when the runtime it ran on is
    /// dropped (an in-memory registry's keeper runs on its callers' runtime).
    started: Arc<AtomicBool>,
}

impl Keeper {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self {
            backend,
            leases: Leases::default(),
            wake: Arc::default(),
            next_wake: Mutex::new(None),
            started: Arc::default(),
        }
    }

    /// Takes a freshly acquired lease into keeping, starting the keeper task if none runs.
    pub(crate) fn hold(self: &Arc<Self>, lease: Arc<Lease>) {
        let next_renew = self.leases.insert(lease);
        if !self.started.swap(true, Ordering::AcqRel) {
            let running = Running(self.started.clone());
            self.backend
                .home()
                .spawn(keep(Arc::downgrade(self), self.wake.clone(), running));
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

    /// The owner is releasing: stop renewing, keep the lease until the server confirmed.
    pub(crate) fn begin_release(&self, id: u64) {
        self.leases.begin_release(id);
    }

    /// A guard was dropped or its release failed: the keeper releases it in the background.
    pub(crate) fn release_in_background(&self, id: u64) {
        self.leases.request_release(id);
        if !self.started.load(Ordering::Acquire) {
            // No keeper task to take it up: it ended with the runtime it ran on (the in-memory
            // store's runs on its callers'), and starts again only with the next lock held.
            self.let_go_of_requested();
        }
        self.wake.notify_one();
    }

    /// Sends now the releases of dropped guards that no keeper task has taken up.
    fn let_go_of_requested(&self) {
        for lease in self.leases.take_requested() {
            let backend = self.backend.clone();
            self.backend.home().spawn_release(async move {
                let_go(&backend, &lease).await;
                lease.labels.ended(lease.confirmed_at.elapsed());
            });
        }
    }

    /// Forgets a lease that is no longer held.
    pub(crate) fn remove(&self, id: u64) {
        self.leases.remove(id);
    }

    /// Every lease held now.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Lease>> {
        self.leases.snapshot()
    }

    /// Takes every lease out of renewal for a shutdown.
    pub(crate) fn stop_all(&self) -> Vec<Arc<Lease>> {
        self.leases.stop_all()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // The registry is gone with guards dropped just before it (the end of a scope that
        // made both): their releases, which the keeper task would have sent, go out now.
        self.let_go_of_requested();
        // Lets a sleeping keeper task notice at once that its registry is gone.
        self.wake.notify_one();
    }
}

/// Clears the keeper's `started` flag when the keeper's future is dropped, however that happens.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

async fn keep(keeper: Weak<Keeper>, wake: Arc<Notify>, _running: Running) {
    loop {
        let until = {
            let Some(keeper) = keeper.upgrade() else {
                return;
            };
            let now = Instant::now();
            // Planned and recorded as one step under `next_wake`'s lock: a lease taken into
            // keeping meanwhile either is in this plan, or finds the time recorded here (not the
            // previous one, which may be earlier than its first renewal) and wakes the keeper.
            let plan = {
                let mut next_wake = keeper
                    .next_wake
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let plan = keeper.leases.plan(now);
                *next_wake = plan.next;
                plan
            };
            for (lease, reason) in plan.lost {
                lease.mark_lost(reason);
            }
            let home = keeper.backend.home();
            for lease in plan.releases {
                home.spawn(release_dropped(keeper.clone(), lease));
            }
            for leases in by_budget(plan.renewals) {
                let batch = keeper.clone();
                home.spawn(async move {
                    renew(&batch, &leases, now).await;
                    batch.wake.notify_one();
                });
            }
            plan.next.unwrap_or(now + Duration::from_secs(3600))
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = wake.notified() => {}
        }
    }
}

/// Leases due together, in batches whose budget (the shortest ttl/3 in the batch) is at least
/// half of each lease's own: ttls within a power of two of each other share a batch, so a
/// long lease is never given a short lease's budget.
fn by_budget(leases: Vec<Arc<Lease>>) -> impl Iterator<Item = Vec<Arc<Lease>>> {
    let mut batches: BTreeMap<u32, Vec<Arc<Lease>>> = BTreeMap::new();
    for lease in leases {
        let bucket = crate::backend::ttl_ms(lease.options.ttl).ilog2();
        batches.entry(bucket).or_default().push(lease);
    }
    batches.into_values()
}

async fn renew(keeper: &Keeper, leases: &[Arc<Lease>], sent_at: Instant) {
    let batch: Vec<Renewal<'_>> = leases
        .iter()
        .flat_map(|l| l.renewals(l.options.ttl))
        .collect();
    // Waiting longer than a third of the shortest ttl would only delay the retries.
    let budget = leases
        .iter()
        .map(|l| l.options.ttl / 3)
        .min()
        .unwrap_or(Duration::from_secs(1));
    // The backend bounds each node's part by `budget`; the outer bound only catches a stuck
    // connect.
    let renewal = keeper.backend.renew(&batch, budget);
    let mut renewal = std::pin::pin!(renewal);
    let outcome = match tokio::time::timeout(budget, renewal.as_mut()).await {
        Ok(outcome) => Ok(outcome),
        Err(_) => {
            // Unanswered for its budget: the leases are in jeopardy while it may still come.
            for lease in leases {
                lease.mark_at_risk("the renewal went unanswered for a third of the ttl");
            }
            tokio::time::timeout(budget, renewal).await
        }
    };
    match outcome {
        Ok(Ok(mut renewed)) => {
            let now = Instant::now();
            if renewed.len() != batch.len() {
                // Answers that cannot be matched to their keys say nothing about any of them.
                renewed = vec![None; batch.len()];
            }
            let mut found = renewed.as_slice();
            let outcomes = leases.iter().map(|lease| {
                let (mine, rest) = found.split_at(lease.key.keys().len().min(found.len()));
                found = rest;
                Renewed::of_all(mine)
            });
            for (lease, outcome) in leases.iter().zip(outcomes.collect::<Vec<_>>()) {
                if !keeper.leases.renewing(lease.id) {
                    // Released meanwhile: a renewal that raced the release (and found the next
                    // holder's token, or no key) says nothing about a lease that has ended.
                    continue;
                }
                match outcome {
                    Some(Renewed::Yes) => {
                        lease.labels.renewal(RenewalOutcome::Renewed);
                        lease.confirm_renewal(sent_at);
                        keeper
                            .leases
                            .reschedule(lease.id, Some(sent_at + lease.options.ttl / 3));
                    }
                    Some(Renewed::Gone) => {
                        lease.labels.renewal(RenewalOutcome::Refused);
                        lease.mark_lost(LostReason::Gone);
                        keeper.leases.reschedule(lease.id, None);
                    }
                    Some(Renewed::Taken) => {
                        lease.labels.renewal(RenewalOutcome::Refused);
                        lease.mark_lost(LostReason::Stolen);
                        keeper.leases.reschedule(lease.id, None);
                    }
                    None => {
                        lease.labels.renewal(RenewalOutcome::Failed);
                        lease.mark_at_risk("the renewal failed");
                        keeper
                            .leases
                            .reschedule(lease.id, Some(now + retry_delay(lease)));
                    }
                }
            }
            let (locks, elapsed_us) = (
                leases.len(),
                u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX),
            );
            report::tell(move || tracing::trace!(locks, elapsed_us, "renewed"));
        }
        failure => {
            let error = match failure {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {budget:?}"),
            };
            let (node, locks) = (keeper.backend.node().to_owned(), leases.len());
            report::tell(move || {
                tracing::warn!(
                    node,
                    locks,
                    %error,
                    "lock renewal failed; retrying before the leases' deadlines"
                );
            });
            let now = Instant::now();
            for lease in leases {
                lease.labels.renewal(RenewalOutcome::Failed);
                lease.mark_at_risk("the renewal failed");
                keeper
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
async fn release_dropped(keeper: Arc<Keeper>, lease: Arc<Lease>) {
    let_go(&keeper.backend, &lease).await;
    keeper.leases.remove(lease.id);
}

/// Releases a lease nobody holds any more, trying again until it would have run out anyway.
async fn let_go(backend: &Backend, lease: &Lease) {
    // A shutdown dropped midway hands over leases whose bodies may still run.
    lease.body_gone().await;
    let give_up = lease.state().deadline + lease.options.ttl;
    retry_release(&lease.key, give_up, || lease.give_back(backend)).await;
}

/// Releases `token`'s hold on `key` in the background, trying again after each failure until
/// `give_up`, when the lock has run out on the server anyway.
pub(crate) async fn release_until(
    backend: &Backend,
    key: &LockKey,
    token: &str,
    share: Share,
    give_up: Instant,
) {
    retry_release(key, give_up, || backend.release(key, token, share)).await;
}

/// Sends `release` until the store answers, or until `give_up` (see [`release_until`]).
async fn retry_release<F, Fut>(key: &LockKey, give_up: Instant, release: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool, crate::error::LockError>>,
{
    let mut backoff = Backoff::new();
    loop {
        match release().await {
            Ok(released) => {
                let key = crate::error::shown(&key.name).to_string();
                report::tell(move || {
                    tracing::debug!(key, released, "lock released in the background");
                });
                return;
            }
            Err(error) => {
                let pause = backoff.next_pause();
                if Instant::now() + pause >= give_up {
                    let key = crate::error::shown(&key.name).to_string();
                    report::tell(move || {
                        tracing::warn!(
                            key,
                            %error,
                            "giving up releasing a lock nobody holds; it expires by its ttl"
                        );
                    });
                    return;
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}
