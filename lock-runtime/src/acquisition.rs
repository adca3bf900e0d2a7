//! The attempt loop behind every acquisition: one attempt at a time, waiting between attempts
//! for a release notification (bounded by the holder's lease), keeping a queued waiter's place,
//! taking a handed-over lock, and letting go of the token when it gives up.
//!
//! Where the store hands locks over, a waiter queues up with its first busy attempt and keeps
//! its place with an attempt every ttl/3; a release then hands it the lock, and the
//! notification alone says so, for the place the waiter held (`Places`): a handoff for a place
//! that a later attempt found taken is stale. Its lease runs from the sending of the attempt
//! that kept that place: the handoff came after that attempt ran, and the key expires with the
//! place. A lock whose lease was already over when it came (a slow reply, a paused process) is
//! tried again or given up, never returned, and an error that no wait changes ends the loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, Attempt, Store};
use crate::backoff::Backoff;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics::{Labels, Refused};
use crate::options::{LockOptions, Share};
use crate::state::RegistryInner;
use crate::{error::LockError, token};

/// Acquires, waiting for notifications while the lock is busy; counts the outcome. A
/// candidate's tokens show its `identity` (see `election`).
pub(crate) async fn acquire_lease(
    inner: Arc<RegistryInner>,
    keys: Vec<String>,
    options: LockOptions,
    identity: Option<&str>,
) -> Result<Arc<Lease>, LockError> {
    let labels = Labels::new(inner.name(), options.template);
    let started = Instant::now();
    // Counted as cancelled unless an outcome is reached: the caller may stop waiting.
    let mut pending = Pending(Some((&labels, started)));
    let outcome = take_lease(&inner, keys, options, identity, &labels).await;
    pending.0 = None;
    match &outcome {
        Ok(_) => labels.acquired(started.elapsed()),
        Err(LockError::Busy { .. }) => labels.refused(Refused::Busy, started.elapsed()),
        Err(_) => labels.refused(Refused::Error, started.elapsed()),
    }
    outcome
}

/// A key is a lock's or an election's (see `election`), never both: a candidate that finds a
/// lock's holder, or a lock request that finds a leader, was given the wrong key, and no wait
/// would change that.
fn other_kind(key: &str, holder: &str, identity: Option<&str>) -> Option<LockError> {
    match (token::identity_of(holder), identity) {
        (Some(leader), None) => Some(LockError::InvalidOptions {
            key: key.to_owned(),
            reason: format!(
                "`{key}` is an election's key (its leader now is `{leader}`), not a lock's: a \
                 lock request would wait for leadership to end; give the lock a key of its own"
            ),
        }),
        (None, Some(_)) => Some(held_as_lock(key)),
        _ => None,
    }
}

/// An election given a key that a lock holds (see [`other_kind`]).
pub(crate) fn held_as_lock(key: &str) -> LockError {
    LockError::InvalidOptions {
        key: key.to_owned(),
        reason: format!(
            "`{key}` is held as a lock, not by a candidate: an election needs a key that only \
             its candidates take; give the election a key of its own"
        ),
    }
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
    identity: Option<&str>,
    labels: &Labels,
) -> Result<Arc<Lease>, LockError> {
    let shown = keys.join(" + ");
    options.validate(&shown)?;
    inner.ensure_open(&shown)?;
    let key = inner.lock_keys(keys)?;
    if key.is_multi() && options.share().is_shared() {
        return Err(LockError::InvalidOptions {
            key: shown,
            reason: "several keys are locked exclusively only: a read lock or a permit over \
                     several keys is not offered; take them one by one"
                .to_owned(),
        });
    }
    let mut token = token::new_token(identity);
    let started = Instant::now();
    // `Duration::MAX` is the natural "wait as long as it takes": beyond the clock's range means
    // no deadline at all (a century stands in for it).
    let give_up_at = started
        .checked_add(options.wait)
        .unwrap_or_else(|| started + crate::options::NO_DEADLINE);
    // A try-lock (no `wait`) never queues: it would only have to leave again. Nor does a
    // permit taker: a release hands over a whole lock, never one permit.
    let share = options.share();
    let queue = inner.backend.hands_over()
        && !options.wait.is_zero()
        && !share.is_shared()
        && !key.is_multi();
    let hub = inner.backend.hub();
    let mut interest = None;
    // Which of a multi-key lock's keys the interest follows: the one last found taken.
    let mut waiting_on = 0;
    let mut attempts = 0u32;
    let mut backoff = Backoff::new();
    // The token may be in the store without a lease to show for it: queued, or taken by an
    // attempt whose reply was lost or whose caller was cancelled while it was on its way. Unless
    // the lock is acquired, it is let go of on the way out.
    let mut let_go = LetGo::default();
    let mut places = Places::default();
    loop {
        attempts += 1;
        if attempts > 1 && inner.backend.undoes_failed_attempts() {
            token = token::new_token(identity);
        }
        // Armed while the attempt is on its way: cancelled there, it may still take the lock.
        let_go.arm(inner, &key, &token, share, options.ttl);
        let sent_at = Instant::now();
        if queue {
            places.sent(attempts, sent_at);
        }
        // Besides this waiter, if it is one: a multi-key lock counts them on any of its keys.
        let others_wait = key
            .keys()
            .iter()
            .map(|k| hub.interested(k.channel()))
            .sum::<usize>()
            > usize::from(interest.is_some());
        let attempt = inner
            .backend
            .acquire(&Acquire {
                key: &key,
                token: &token,
                ttl: options.ttl,
                fencing: options.fencing,
                attempt: attempts,
                queue,
                waits: !options.wait.is_zero(),
                others_wait,
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
                retry_after,
                at,
                holder,
            }) => {
                if let Some(error) = holder
                    .as_deref()
                    .and_then(|holder| other_kind(&key.name, holder, identity))
                {
                    return Err(error);
                }
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
                    let_go.may_be_in_store();
                } else {
                    // Refused and not queued: the token is nowhere in the store.
                    let_go.disarm();
                }
                if now >= give_up_at {
                    return Err(LockError::Busy {
                        key: key.name.clone(),
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
                if error.never_sent() {
                    let_go.sent_nothing();
                } else {
                    let_go.may_be_in_store();
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
    tracing::debug!(key = %crate::error::shown(&key.name), "a lock taken after its lease ran out");
    if now < give_up_at {
        return Some(Ok(()));
    }
    Some(Err(LockError::Backend {
        node: node.to_owned(),
        command: "acquire",
        key: Some(key.name.clone()),
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
        key = %crate::error::shown(&lease.key.name),
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
#[derive(Default)]
struct LetGo {
    armed: Option<(Arc<RegistryInner>, LockKey, String, Share, Duration)>,
    /// Whether an attempt that came back left the armed token in the store, or may have: queued
    /// there, or holding the lock (its reply was lost, it failed midway). One in flight may.
    in_store: bool,
}

impl LetGo {
    fn arm(
        &mut self,
        inner: &Arc<RegistryInner>,
        key: &LockKey,
        token: &str,
        share: Share,
        ttl: Duration,
    ) {
        match &mut self.armed {
            Some((_, _, armed, ..)) if armed == token => {}
            Some((_, _, armed, ..)) => {
                // Redlock's fresh token per attempt; the earlier ones are undone by Redlock.
                *armed = token.to_owned();
                self.in_store = false;
            }
            None => {
                self.armed = Some((inner.clone(), key.clone(), token.to_owned(), share, ttl));
            }
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
        self.in_store = false;
    }

    /// The attempt just made reached no server: unless an earlier one may have left the token
    /// in the store, there is nothing to let go of.
    fn sent_nothing(&mut self) {
        if !self.in_store {
            self.disarm();
        }
    }

    fn may_be_in_store(&mut self) {
        self.in_store = true;
    }

    /// Lets go of the armed token now, in the background.
    fn release_now(&mut self) {
        drop(std::mem::take(self));
    }
}

impl Drop for LetGo {
    fn drop(&mut self) {
        if let Some((inner, key, token, share, ttl)) = self.armed.take() {
            let task = inner.clone();
            // A lock the attempt took runs out within its ttl of now (the attempt was sent
            // before this): until then, a release that failed is tried again.
            let give_up = tokio::time::Instant::now() + ttl;
            inner.backend.home().spawn_release(async move {
                crate::keeper::release_until(&task.backend, &key, &token, share, give_up).await;
            });
        }
    }
}
