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

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::backend::{Acquire, Attempt, Store};
use crate::backoff::Backoff;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics::{Labels, Refused};
use crate::options::{LockOptions, Share};
use crate::spans;
use crate::state::RegistryInner;
use crate::waiting::Interest;
use crate::{error::LockError, token};

/// Acquires, waiting for notifications while the lock is busy; counts the outcome and traces
/// it (`lock.acquire`). A candidate's tokens show its `identity` (see `election`).
pub(crate) async fn acquire_lease(
    inner: Arc<RegistryInner>,
    keys: Vec<String>,
    options: LockOptions,
    identity: Option<&str>,
) -> Result<Arc<Lease>, LockError> {
    let labels = Labels::new(inner.name(), options.template);
    let traced = Traced {
        acquire: spans::acquire(inner.name(), &keys, &options),
        caller: Span::current(),
    };
    let waits = !options.wait.is_zero();
    let started = Instant::now();
    // Counted as cancelled unless an outcome is reached: the caller may stop waiting.
    let mut pending = Pending(Some((&labels, &traced.acquire, started)));
    let outcome = take_lease(&inner, keys, options, identity, &labels, &traced)
        .instrument(traced.acquire.clone())
        .await;
    pending.0 = None;
    match &outcome {
        Ok(_) => labels.acquired(started.elapsed()),
        Err(LockError::Busy { .. }) => labels.refused(Refused::Busy, started.elapsed()),
        Err(_) => labels.refused(Refused::Error, started.elapsed()),
    }
    spans::ended(&traced.acquire, outcome.as_ref().map(|_| ()), waits);
    outcome
}

/// A request's spans: its own, and its caller's, which its lease's `lock.hold` is a child of.
struct Traced {
    acquire: Span,
    caller: Span,
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
struct Pending<'a>(Option<(&'a Labels, &'a Span, Instant)>);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some((labels, span, started)) = self.0.take() {
            labels.refused(Refused::Cancelled, started.elapsed());
            spans::cancelled(span);
        }
    }
}

/// [`acquire_lease`] without its measurements: attempts until one takes the lock, is handed
/// it, or gives up, waiting between them.
async fn take_lease(
    inner: &Arc<RegistryInner>,
    keys: Vec<String>,
    options: LockOptions,
    identity: Option<&str>,
    labels: &Labels,
    traced: &Traced,
) -> Result<Arc<Lease>, LockError> {
    let mut attempts = Attempts::start(inner, keys, options, identity, labels, traced)?;
    loop {
        attempts.ensure_open()?;
        if attempts.sits_out() {
            attempts.rejoined().await?;
        }
        let (sent_at, outcome) = attempts.attempt().await;
        let now = Instant::now();
        let step = match outcome {
            Ok(Attempt::Acquired { fence }) => attempts.acquired(fence, sent_at, now)?,
            Ok(Attempt::Busy {
                retry_after,
                at,
                holder,
            }) => {
                attempts
                    .busy(retry_after, at, holder.as_deref(), sent_at, now)
                    .await?
            }
            Err(error) => attempts.failed(error, now)?,
        };
        let step = match step {
            Step::Wait(wake_at) => attempts.wait(wake_at).await?,
            step => step,
        };
        if let Step::Take {
            fence,
            sent_at,
            handed,
        } = step
        {
            if attempts.standing_aside() {
                attempts.pass_on().await;
                continue;
            }
            return attempts.take(fence, sent_at, handed).await;
        }
    }
}

/// What an acquisition does next.
enum Step {
    /// Take the lock: its lease runs from the attempt sent at `sent_at`.
    Take {
        fence: Option<u64>,
        sent_at: Instant,
        handed: bool,
    },
    /// Attempt again at once.
    Again,
    /// Wait for a release, a handoff or this instant, whichever comes first.
    Wait(Instant),
}

/// One acquisition's attempts, and what it keeps between them.
struct Attempts<'a> {
    inner: &'a Arc<RegistryInner>,
    key: LockKey,
    options: LockOptions,
    identity: Option<&'a str>,
    labels: &'a Labels,
    traced: &'a Traced,
    share: Share,
    /// The token of the next attempt (Redlock's attempts have one each).
    token: String,
    started: Instant,
    give_up_at: Instant,
    /// Whether a busy attempt queues this waiter, so that a release hands it the lock.
    queue: bool,
    /// This waiter's interest in release notifications, from its first busy attempt on.
    interest: Option<Interest<'a>>,
    /// Which of a multi-key lock's keys the interest follows: the one last found taken.
    waiting_on: usize,
    attempts: u32,
    backoff: Backoff,
    /// The token may be in the store without a lease to show for it: queued, or taken by an
    /// attempt whose reply was lost or whose caller was cancelled while it was on its way.
    /// Unless the lock is acquired, it is let go of on the way out.
    let_go: LetGo,
    places: Places,
    /// An election's candidate: whether it stands aside (see `Election::stand_aside`).
    aside: Option<watch::Receiver<bool>>,
}

impl<'a> Attempts<'a> {
    /// Checks the request and decides how it waits; sends nothing.
    fn start(
        inner: &'a Arc<RegistryInner>,
        keys: Vec<String>,
        options: LockOptions,
        identity: Option<&'a str>,
        labels: &'a Labels,
        traced: &'a Traced,
    ) -> Result<Self, LockError> {
        let shown = keys.join(" + ");
        options.validate(&shown)?;
        inner.ensure_open(&shown)?;
        // An election's one key, as given: its candidate follows its flag there.
        let aside = identity.map(|identity| inner.aside(&shown, identity));
        let key = inner.lock_keys(keys)?;
        let share = options.share();
        if key.is_multi() && share.is_shared() {
            return Err(LockError::InvalidOptions {
                key: shown,
                reason: "several keys are locked exclusively only: a read lock or a permit over \
                         several keys is not offered; take them one by one"
                    .to_owned(),
            });
        }
        let started = Instant::now();
        // `Duration::MAX` is the natural "wait as long as it takes": beyond the clock's range
        // means no deadline at all (a century stands in for it).
        let give_up_at = started
            .checked_add(options.wait)
            .unwrap_or_else(|| started + crate::options::NO_DEADLINE);
        // A try-lock (no `wait`) never queues: it would only have to leave again. Nor does a
        // permit taker: a release hands over a whole lock, never one permit.
        let queue = inner.backend.hands_over()
            && !options.wait.is_zero()
            && !share.is_shared()
            && !key.is_multi();
        Ok(Self {
            inner,
            key,
            options,
            identity,
            labels,
            traced,
            share,
            token: token::new_token(identity),
            started,
            give_up_at,
            queue,
            interest: None,
            waiting_on: 0,
            attempts: 0,
            backoff: Backoff::new(),
            let_go: LetGo::default(),
            places: Places::default(),
            aside,
        })
    }

    /// Whether this candidate stands aside now (marking the flag seen: a wait wakes on the next
    /// change only).
    fn standing_aside(&mut self) -> bool {
        self.aside
            .as_mut()
            .is_some_and(|aside| *aside.borrow_and_update())
    }

    /// Whether this candidate stands aside where its store keeps no place for it: it sends
    /// nothing until it rejoins.
    fn sits_out(&mut self) -> bool {
        !self.inner.backend.stands_aside() && self.standing_aside()
    }

    /// Waits until this candidate rejoins (or its wait is over, or the registry shut down).
    async fn rejoined(&mut self) -> Result<(), LockError> {
        let inner = self.inner;
        if let Some(aside) = &mut self.aside {
            let rejoined = async {
                tokio::select! {
                    _ = aside.wait_for(|standing| !standing) => {}
                    () = inner.closing() => {}
                }
            };
            if tokio::time::timeout_at(self.give_up_at, rejoined)
                .await
                .is_err()
            {
                return Err(LockError::Busy {
                    key: self.key.name.clone(),
                    retry_after: None,
                });
            }
        }
        self.ensure_open()
    }

    /// The lock came to this candidate as it stood aside (handed to it, or taken by an attempt
    /// sent before it stood aside): given back at once, as a release would, to the next in
    /// line; its work never starts. The token is retired with it: a release whose answer was
    /// lost may still land later, and must find nothing of this candidate's to end. Its next
    /// attempt queues again, with a fresh token.
    async fn pass_on(&mut self) {
        if let Err(error) = self
            .inner
            .backend
            .release(&self.key, &self.token, self.share)
            .await
        {
            // Its lease runs out by itself.
            tracing::debug!(%error, "a lock taken while standing aside was not given back");
        }
        self.token = token::new_token(self.identity);
        self.places = Places::default();
        if let (Some(interest), true) = (&mut self.interest, self.queue) {
            interest.expect_handoff(&self.token);
        }
    }

    /// Refuses to go on once the registry was shut down: a waiting candidate (one standing
    /// aside too, which nothing else would end) leaves the line.
    fn ensure_open(&self) -> Result<(), LockError> {
        self.inner.ensure_open(&self.key.name)
    }

    /// Sends one attempt; returns when it was sent, and its outcome.
    async fn attempt(&mut self) -> (Instant, Result<Attempt, LockError>) {
        self.attempts += 1;
        self.traced.acquire.record("lock.attempts", self.attempts);
        if self.attempts > 1 && self.inner.backend.undoes_failed_attempts() {
            self.token = token::new_token(self.identity);
        }
        // Armed while the attempt is on its way: cancelled there, it may still take the lock.
        self.let_go.arm(
            self.inner,
            &self.key,
            &self.token,
            self.share,
            self.options.ttl,
        );
        let aside = self.inner.backend.stands_aside() && self.standing_aside();
        let sent_at = Instant::now();
        if self.queue {
            self.places.sent(self.attempts, sent_at);
        }
        let hub = self.inner.backend.hub();
        // Besides this waiter, if it is one: a multi-key lock counts them on any of its keys.
        let others_wait = self
            .key
            .keys()
            .iter()
            .map(|k| hub.interested(k.channel()))
            .sum::<usize>()
            > usize::from(self.interest.is_some());
        let outcome = self
            .inner
            .backend
            .acquire(&Acquire {
                key: &self.key,
                token: &self.token,
                ttl: self.options.ttl,
                fencing: self.options.fencing,
                attempt: self.attempts,
                queue: self.queue,
                waits: !self.options.wait.is_zero(),
                others_wait,
                share: self.share,
                give_up_at: self.give_up_at,
                aside,
            })
            .await;
        (sent_at, outcome)
    }

    /// The attempt sent at `sent_at` took the lock: take it, unless its lease is already over.
    fn acquired(
        &mut self,
        fence: Option<u64>,
        sent_at: Instant,
        now: Instant,
    ) -> Result<Step, LockError> {
        if self.late(sent_at, now)? {
            // Held on the server, but not for long enough to be trusted here: try again at
            // once, which finds this token and renews its lease (Redlock's next attempt has a
            // token of its own, so this one is let go of now).
            if self.inner.backend.undoes_failed_attempts() {
                self.let_go.release_now();
            }
            return Ok(Step::Again);
        }
        if self.share.is_shared() && self.interest.take().is_some() {
            // A release wakes one waiter per process, but may have freed more than one permit
            // (or the lock behind them): the next waiter here tries too.
            self.inner.backend.hub().notify(self.key.channel());
        }
        Ok(Step::Take {
            fence,
            sent_at,
            handed: false,
        })
    }

    /// The attempt sent at `sent_at` found the lock taken (`at`: which of its keys): give up,
    /// follow the key's releases first, or wait for the next one.
    async fn busy(
        &mut self,
        retry_after: Option<Duration>,
        at: usize,
        holder: Option<&str>,
        sent_at: Instant,
        now: Instant,
    ) -> Result<Step, LockError> {
        if let Some(error) = holder.and_then(|h| other_kind(&self.key.name, h, self.identity)) {
            return Err(error);
        }
        let hub = self.inner.backend.hub();
        if at != self.waiting_on && self.interest.take().is_some() {
            // Another of a multi-key lock's keys is taken now: follow that one, and pass on
            // the wake that may have brought this waiter here (a release wakes one waiter per
            // process; another may be able to use the key that came free).
            hub.notify(self.waited_key().channel());
            self.waiting_on = at;
            return Ok(Step::Again);
        }
        self.waiting_on = at;
        if self.queue {
            self.places.busy(self.attempts);
            self.let_go.may_be_in_store();
        } else {
            // Refused and not queued: the token is nowhere in the store.
            self.let_go.disarm();
        }
        if now >= self.give_up_at {
            return Err(LockError::Busy {
                key: self.key.name.clone(),
                retry_after,
            });
        }
        let Some(interest) = &self.interest else {
            // Subscribe first, then try again at once: a release that happened since the
            // failed attempt would otherwise go unnoticed until the lease ran out.
            let mut fresh = hub
                .interest(self.waited_key().channel(), self.give_up_at)
                .await;
            if self.queue {
                fresh.expect_handoff(&self.token);
            }
            self.interest = Some(fresh);
            return Ok(Step::Again);
        };
        // A lost message costs at most the holder's remaining lease.
        let mut wake_at = match retry_after {
            Some(left) => sent_at + left + Duration::from_millis(1),
            None => now + Duration::from_secs(1),
        };
        if !interest.notified_by_server() {
            wake_at = wake_at.min(now + self.backoff.next_pause());
        }
        if self.queue {
            // Keeps this waiter's place, which lasts one ttl from each attempt.
            wake_at = wake_at.min(sent_at + self.options.ttl / 3);
        }
        Ok(Step::Wait(wake_at.min(self.give_up_at)))
    }

    /// The attempt failed: waiting is for a busy lock, so an error that no wait changes is
    /// final; another is tried again within `wait`.
    fn failed(&mut self, error: LockError, now: Instant) -> Result<Step, LockError> {
        if !error.is_transient() {
            // Such an error is a refusal that wrote nothing: after a first attempt there is
            // nothing to let go (later, the token may be queued from before).
            if self.attempts == 1 {
                self.let_go.disarm();
            }
            return Err(error);
        }
        if error.never_sent() {
            self.let_go.sent_nothing();
        } else {
            self.let_go.may_be_in_store();
        }
        if now >= self.give_up_at {
            return Err(error);
        }
        tracing::debug!(%error, "lock attempt failed; retrying within `wait`");
        Ok(Step::Wait(
            (now + self.backoff.next_pause()).min(self.give_up_at),
        ))
    }

    /// Waits until `wake_at`, or a release, or a handoff of the lock to this waiter (taken,
    /// unless stale or already over).
    async fn wait(&mut self, wake_at: Instant) -> Result<Step, LockError> {
        // A candidate that stands aside or rejoins tells the store at once; a shutdown ends
        // the wait (`take_lease` then refuses to go on).
        let mut aside = self.aside.clone();
        let inner = self.inner;
        let flipped = async {
            match &mut aside {
                Some(aside) => tokio::select! {
                    _ = aside.changed() => {}
                    () = inner.closing() => {}
                },
                None => inner.closing().await,
            }
        };
        let Some(interest) = &self.interest else {
            tokio::select! {
                () = tokio::time::sleep_until(wake_at) => {}
                () = flipped => {}
            }
            return Ok(Step::Again);
        };
        // A grant first: one that came to a candidate as it stood aside is passed on (`take_lease`).
        tokio::select! {
            biased;
            grant = interest.handed_over() => {
                // Only a place that no later attempt found taken: an attempt after it that was
                // refused saw the handed key gone (it would have found its own token), so the
                // grant is stale, and the lock is another's now.
                let Some(sent_at) = self.places.of(grant.place) else {
                    return Ok(Step::Again);
                };
                if self.late(sent_at, Instant::now())? {
                    return Ok(Step::Again);
                }
                Ok(Step::Take {
                    fence: self.options.fencing.then_some(grant.fence),
                    sent_at,
                    handed: true,
                })
            }
            () = interest.released() => Ok(Step::Again),
            () = tokio::time::sleep_until(wake_at) => Ok(Step::Again),
            () = flipped => Ok(Step::Again),
        }
    }

    /// Whether a lock taken by the attempt sent at `sent_at` can no longer be trusted by `now`
    /// (its lease, ttl - drift from the sending, is over: a slow reply, or this process
    /// paused): to try again, or an error to give up with once `wait` is over.
    fn late(&self, sent_at: Instant, now: Instant) -> Result<bool, LockError> {
        match late_lease(
            self.inner.backend.node(),
            &self.key,
            &self.options,
            sent_at,
            now,
            self.give_up_at,
        ) {
            None => Ok(false),
            Some(late) => late.map(|()| true),
        }
    }

    /// The key whose releases this waiter follows.
    fn waited_key(&self) -> &LockKey {
        self.key.keys().get(self.waiting_on).unwrap_or(&self.key)
    }

    /// The lock is this acquisition's: its lease, admitted by the registry.
    async fn take(
        mut self,
        fence: Option<u64>,
        sent_at: Instant,
        handed: bool,
    ) -> Result<Arc<Lease>, LockError> {
        self.let_go.disarm();
        let lease = Lease::new(
            self.inner.next_lease_id(),
            self.key,
            self.token,
            fence,
            self.options,
            sent_at,
            self.labels.clone(),
        );
        self.inner.admit(&lease).await?;
        let traced = self.traced;
        lease.observe(spans::hold(
            &traced.caller,
            &lease.key.name,
            lease.options.template,
            fence,
        ));
        traced.acquire.record("lock.fence", fence);
        traced.acquire.record("lock.handed_over", handed);
        if handed {
            self.labels.handed_over();
        }
        tracing::debug!(
            key = %crate::error::shown(&lease.key.name),
            fence = lease.fence,
            attempts = self.attempts,
            waited_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "lock acquired"
        );
        Ok(lease)
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
    if now < options.deadline(sent_at) {
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
