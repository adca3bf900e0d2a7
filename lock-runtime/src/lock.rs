//! Taking a lock: the request builder, the acquisition loop, the guard, and guarded bodies.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, Attempt, Store};
use crate::backoff::Backoff;
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics::{Labels, Refused};
use crate::state::RegistryInner;
use crate::{current, token, LockError, LockOptions, Mode, OnLost};

/// A lock request: built by [`Registry::lock`](crate::Registry::lock), finished by [`acquire`](Self::acquire) or
/// [`run`](Self::run).
#[must_use = "a lock request does nothing until `.acquire()` or `.run(..)` is awaited"]
#[derive(Debug)]
pub struct LockRequest {
    registry: Arc<RegistryInner>,
    /// One key, or a multi-key lock's keys as given.
    keys: Vec<String>,
    options: LockOptions,
}

impl LockRequest {
    pub(crate) fn new(registry: Arc<RegistryInner>, keys: Vec<String>) -> Self {
        Self {
            registry,
            keys,
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

    /// See [`LockOptions::mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.options = self.options.mode(mode);
        self
    }

    /// See [`LockOptions::permits`].
    pub fn permits(mut self, permits: u32) -> Self {
        self.options = self.options.permits(permits);
        self
    }

    /// See [`LockOptions::template`].
    pub fn template(mut self, template: &'static str) -> Self {
        self.options = self.options.template(template);
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
        let inner = self.registry;
        match current::held(&inner, &self.keys) {
            current::Held::No => {}
            current::Held::All(lease) => {
                let (held, asked) = (lease.options.share(), self.options.share());
                if let Some(reason) = current::cannot_reenter(held, asked) {
                    return Err(LockError::InvalidOptions {
                        key: self.keys.join(" + "),
                        reason,
                    });
                }
                return Ok(LockGuard::reentered(inner, lease));
            }
            current::Held::Some(held) => {
                return Err(LockError::InvalidOptions {
                    key: self.keys.join(" + "),
                    reason: format!(
                        "this task already holds `{held}` in another lock; a lock over several \
                         keys takes them all in one request (keys taken one request at a time is \
                         how two tasks deadlock), so take them together from the start"
                    ),
                });
            }
        }
        let lease = if inner.on_caller_runtime() {
            acquire_lease(inner.clone(), self.keys, self.options).await?
        } else {
            // The whole acquisition (attempts, subscribing, waiting) runs on the I/O runtime,
            // next to the connections: a release notification wakes the waiter there and its
            // next attempt goes out at once, with no other thread to wake in between; only the
            // outcome crosses over to the caller.
            acquire_on_io(inner.clone(), self.keys, self.options).await?
        };
        Ok(LockGuard::new(inner, lease))
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
                // The loss first: a body is never polled, not even once, with a lease that is
                // already lost (a process paused between the acquisition and this poll).
                tokio::select! {
                    biased;
                    reason = guard.lease.wait_lost() => Err(reason),
                    outcome = &mut body => Ok(outcome),
                }
            }
            OnLost::Continue => Ok(body.await),
        };
        // A body that completes in the very poll it resumes in (after a process pause, a GC, a
        // blocking call) can outrun the loss timer: under Cancel, a lease that is already past
        // its deadline means the work may have overlapped the next holder's, so say so.
        let outcome = match (on_lost, guard.lease.lost_reason()) {
            (OnLost::Cancel, Some(reason)) if outcome.is_ok() => {
                guard.lease.mark_lost(reason);
                Err(reason)
            }
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
    keys: Vec<String>,
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
        let outcome = acquire_lease(inner.clone(), keys, options).await;
        if let Err(Ok(lease)) = deliver.send(outcome) {
            inner.keeper.release_in_background(lease.id);
        }
    });
    let _cancel_with_the_caller = AbortOnDrop(task.abort_handle());
    delivered
        .await
        .unwrap_or_else(|_| panic!("lock-runtime: the acquisition task ended without an outcome"))
}

/// Acquires, waiting for notifications while the lock is busy.
///
/// Where the store hands locks over, a waiter queues up with its first busy attempt and keeps
/// its place with an attempt every ttl/3; a release then hands it the lock, and the
/// notification alone says so. Its lease runs from the sending of the last attempt that still
/// found it queued: the handoff came after that attempt ran, so the key expires no earlier.
async fn acquire_lease(
    inner: Arc<RegistryInner>,
    keys: Vec<String>,
    options: LockOptions,
) -> Result<Arc<Lease>, LockError> {
    let labels = Labels::new(inner.name(), options.template);
    let started = Instant::now();
    // Counted as cancelled unless an outcome is reached: the caller may stop waiting.
    let mut pending = Pending(Some((&labels, started)));
    let outcome = take_lease(&inner, keys, options, &labels).await;
    pending.0 = None;
    match &outcome {
        Ok(_) => labels.acquired(started.elapsed()),
        Err(LockError::Busy { .. }) => labels.refused(Refused::Busy, started.elapsed()),
        Err(_) => labels.refused(Refused::Error, started.elapsed()),
    }
    outcome
}

/// A request in progress, counted as cancelled if dropped before its outcome.
struct Pending<'a>(Option<(&'a Labels, Instant)>);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some((labels, started)) = self.0.take() {
            labels.refused(Refused::Cancelled, started.elapsed());
        }
    }
}

/// [`acquire_lease`] without its measurements.
async fn take_lease(
    inner: &Arc<RegistryInner>,
    keys: Vec<String>,
    options: LockOptions,
    labels: &Labels,
) -> Result<Arc<Lease>, LockError> {
    let shown = keys.join(" + ");
    options.validate(&shown)?;
    inner.ensure_open(&shown)?;
    let key = inner.lock_keys(keys)?;
    if !key.all.is_empty() && options.share().is_shared() {
        return Err(LockError::InvalidOptions {
            key: shown,
            reason: "several keys are locked exclusively only: a read lock or a permit over \
                     several keys is not offered; take them one by one"
                .to_owned(),
        });
    }
    let mut token = token::new_token();
    let started = Instant::now();
    // `Duration::MAX` is the natural "wait as long as it takes": beyond the clock's range means
    // no deadline at all (a century stands in for it).
    let give_up_at = started
        .checked_add(options.wait)
        .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
    // A try-lock (no `wait`) never queues: it would only have to leave again. Nor does a
    // permit taker: a release hands over a whole lock, never one permit.
    let share = options.share();
    let queue = inner.backend.hands_over()
        && !options.wait.is_zero()
        && !share.is_shared()
        && key.all.is_empty();
    let hub = inner.backend.hub();
    let mut interest = None;
    // Which of a multi-key lock's keys the interest follows: the one last found taken.
    let mut waiting_on = 0;
    let mut attempts = 0u32;
    let mut backoff = Backoff::new();
    // The token may be in the store without a lease to show for it: queued, or taken by an
    // attempt whose reply was lost or whose caller was cancelled while it was on its way. Unless
    // the lock is acquired, it is let go of on the way out.
    let mut let_go = LetGo(None);
    let mut places = Places::default();
    loop {
        attempts += 1;
        if attempts > 1 && inner.backend.undoes_failed_attempts() {
            token = token::new_token();
        }
        // Armed while the attempt is on its way: cancelled there, it may still take the lock.
        let_go.arm(inner, &key, &token);
        let sent_at = Instant::now();
        if queue {
            places.sent(attempts, sent_at);
        }
        let attempt = inner
            .backend
            .acquire(&Acquire {
                key: &key,
                token: &token,
                ttl: options.ttl,
                fencing: options.fencing,
                attempt: attempts,
                queue,
                share,
            })
            .await;
        let now = Instant::now();
        let wake_at = match attempt {
            Ok(Attempt::Acquired { fence }) => {
                if let Some(late) = late_lease(
                    inner.backend.node(),
                    &key,
                    &options,
                    sent_at,
                    now,
                    give_up_at,
                ) {
                    // Held on the server, but not for long enough to be trusted here: let go
                    // of it (on the way out), or try again at once, which finds this token
                    // and renews its lease (Redlock's next attempt has a token of its own, so
                    // this one is let go of now).
                    late?;
                    if inner.backend.undoes_failed_attempts() {
                        let_go.release_now();
                    }
                    continue;
                }
                let_go.disarm();
                if share.is_shared() && interest.take().is_some() {
                    // A release wakes one waiter per process, but may have freed more than one
                    // permit (or the lock behind them): the next waiter here tries too.
                    hub.notify(key.channel());
                }
                return admitted(
                    inner, key, token, fence, options, sent_at, attempts, started, labels,
                )
                .await;
            }
            Ok(Attempt::Busy {
                retry_after, at, ..
            }) => {
                if at != waiting_on && interest.take().is_some() {
                    // Another of a multi-key lock's keys is taken now: follow that one, and pass
                    // on the wake that may have brought this waiter here (a release wakes one
                    // waiter per process; another may be able to use the key that came free).
                    hub.notify(key.keys().get(waiting_on).unwrap_or(&key).channel());
                    waiting_on = at;
                    continue;
                }
                waiting_on = at;
                if queue {
                    places.busy(attempts);
                } else {
                    // Refused and not queued: the token is nowhere in the store.
                    let_go.disarm();
                }
                if now >= give_up_at {
                    return Err(LockError::Busy {
                        key: key.key.clone(),
                        retry_after,
                    });
                }
                let Some(current) = &interest else {
                    // Subscribe first, then try again at once: a release that happened since the
                    // failed attempt would otherwise go unnoticed until the lease ran out.
                    let channel = key.keys().get(waiting_on).unwrap_or(&key).channel();
                    let mut fresh = hub.interest(channel, give_up_at).await;
                    if queue {
                        fresh.expect_handoff(&token);
                    }
                    interest = Some(fresh);
                    continue;
                };
                // A lost message costs at most the holder's remaining lease.
                let mut at = match retry_after {
                    Some(left) => sent_at + left + Duration::from_millis(1),
                    None => now + Duration::from_secs(1),
                };
                if !current.notified_by_server() {
                    at = at.min(now + backoff.next_pause());
                }
                if queue {
                    // Keeps this waiter's place, which lasts one ttl from each attempt.
                    at = at.min(sent_at + options.ttl / 3);
                }
                at.min(give_up_at)
            }
            Err(error) => {
                // Waiting is for a busy lock; an error that no wait changes is final. Such an
                // error is a refusal that wrote nothing: after a first attempt there is nothing
                // to let go (later, the token may be queued from before).
                if !error.is_transient() {
                    if attempts == 1 {
                        let_go.disarm();
                    }
                    return Err(error);
                }
                if now >= give_up_at {
                    return Err(error);
                }
                tracing::debug!(%error, "lock attempt failed; retrying within `wait`");
                (now + backoff.next_pause()).min(give_up_at)
            }
        };
        let Some(current) = &interest else {
            tokio::time::sleep_until(wake_at).await;
            continue;
        };
        tokio::select! {
            grant = current.handed_over() => {
                // Only a place that no later attempt found taken: an attempt after it that
                // was refused saw the handed key gone (it would have found its own token), so
                // the grant is stale, and the lock is another's now.
                let Some(sent_at) = places.of(grant.place) else {
                    continue;
                };
                let now = Instant::now();
                if let Some(late) = late_lease(inner.backend.node(), &key, &options, sent_at, now, give_up_at) {
                    late?;
                    continue;
                }
                let_go.disarm();
                let fence = options.fencing.then_some(grant.fence);
                let lease = admitted(
                    inner, key, token, fence, options, sent_at, attempts, started, labels,
                )
                .await?;
                labels.handed_over();
                return Ok(lease);
            }
            () = current.released() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

/// The attempts of a queued waiter that may hold its place in the queue, with when each was
/// sent: the last one found busy, and those after it (whose answers were lost). A handoff
/// names the attempt whose place it went to; the key expires a ttl after that attempt ran.
#[derive(Default)]
struct Places(Vec<(u32, Instant)>);

impl Places {
    fn sent(&mut self, attempt: u32, at: Instant) {
        self.0.push((attempt, at));
    }

    /// `attempt` found the lock taken and queued the waiter: the places before it are gone.
    fn busy(&mut self, attempt: u32) {
        self.0.retain(|(a, _)| *a >= attempt);
    }

    /// When the attempt that took `place` was sent, unless a later attempt was refused since.
    /// A releaser that names no place is taken to mean the newest.
    fn of(&self, place: Option<u32>) -> Option<Instant> {
        match place {
            Some(place) => self.0.iter().find(|(a, _)| *a == place).map(|(_, at)| *at),
            None => self.0.last().map(|(_, at)| *at),
        }
    }
}

/// `Some` when a lock taken by an attempt sent at `sent_at` (on `node`) can no longer be trusted by `now`
/// (its lease, ttl - drift from the sending, is over: a slow reply, or this process paused):
/// `Ok` to try again, or the error to give up with once `wait` is over.
fn late_lease(
    node: &str,
    key: &LockKey,
    options: &LockOptions,
    sent_at: Instant,
    now: Instant,
    give_up_at: Instant,
) -> Option<Result<(), LockError>> {
    if now < sent_at + options.ttl - options.drift() {
        return None;
    }
    tracing::debug!(key = %crate::error::shown(&key.key), "a lock taken after its lease ran out");
    if now < give_up_at {
        return Some(Ok(()));
    }
    Some(Err(LockError::Backend {
        node: node.to_owned(),
        command: "acquire",
        key: Some(key.key.clone()),
        message: format!(
            "the lock was taken, but only {:?} after the attempt was sent, when its {:?} lease \
             could no longer be trusted (a slow network or server, or this process paused), so \
             it was let go of; use a ttl of several round trips",
            now - sent_at,
            options.ttl
        ),
        source: None,
    }))
}

/// The lease of an acquired lock, admitted by the registry.
#[allow(clippy::too_many_arguments)]
async fn admitted(
    inner: &Arc<RegistryInner>,
    key: LockKey,
    token: String,
    fence: Option<u64>,
    options: LockOptions,
    sent_at: Instant,
    attempts: u32,
    started: Instant,
    labels: &Labels,
) -> Result<Arc<Lease>, LockError> {
    let lease = Lease::new(
        inner.next_lease_id(),
        key,
        token,
        fence,
        options,
        sent_at,
        labels.clone(),
    );
    inner.admit(&lease).await?;
    tracing::debug!(
        key = %crate::error::shown(&lease.key.key),
        fence = lease.fence,
        attempts,
        waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "lock acquired"
    );
    Ok(lease)
}

/// Lets go of an acquisition's token in the background when dropped armed (the acquisition
/// gave up, failed or was cancelled): takes it out of the waiters' queue, and releases the lock
/// if it holds it after all (a reply was lost, an attempt was cancelled on its way, or a release
/// handed it over just now), so it goes on to the next waiter instead of sitting out its ttl.
struct LetGo(Option<(Arc<RegistryInner>, LockKey, String)>);

impl LetGo {
    fn arm(&mut self, inner: &Arc<RegistryInner>, key: &LockKey, token: &str) {
        match &mut self.0 {
            Some((_, _, armed)) if armed == token => {}
            Some((_, _, armed)) => {
                // Redlock's fresh token per attempt; the earlier ones are undone by Redlock.
                *armed = token.to_owned();
            }
            None => self.0 = Some((inner.clone(), key.clone_names(), token.to_owned())),
        }
    }

    fn disarm(&mut self) {
        self.0 = None;
    }

    /// Lets go of the armed token now, in the background.
    fn release_now(&mut self) {
        drop(std::mem::replace(self, LetGo(None)));
    }
}

impl Drop for LetGo {
    fn drop(&mut self) {
        if let Some((inner, key, token)) = self.0.take() {
            let task = inner.clone();
            inner.spawn_background(async move {
                let _ = task.backend.release(&key, &token).await;
            });
        }
    }
}
