//! A held lease: its local deadline and the signal that tells everyone when it is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Span;

use crate::backend::{ttl_ms, Backend, Renewal, Store, NOTE_HELD_EVERY};
use crate::key::LockKey;
use crate::metrics::Labels;
use crate::options::Share;
use crate::report;
use crate::spans;
use crate::{error::LockError, error::LostReason, options::LockOptions};

#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseState {
    /// Send time of the last confirmed acquisition or renewal, plus ttl, minus drift. The key
    /// cannot expire on the server before this instant, because the server started its clock
    /// after we sent the command.
    pub deadline: Instant,
    pub lost: Option<LostReason>,
    /// A renewal failed, or went unanswered for its budget, and none has been confirmed since:
    /// the lease still holds until `deadline`, but may not be renewed before it.
    pub at_risk: bool,
    /// A guarded body (or a term's work) runs under this lease: a shutdown lets the key go
    /// only once it is gone.
    pub body: bool,
    /// The work under this lease was asked to wind down (an election's step-down) and must
    /// have returned by then, or be dropped.
    pub step_down_by: Option<Instant>,
    /// This side ended the lease because a step-down's grace ran out, not because its work
    /// returned or its holder let go.
    pub forced: bool,
    /// The store answered a release of this lease (see [`Lease::give_back`]).
    pub let_go: bool,
    /// Releases of this lease on their way to the store (the holder's and the keeper's can
    /// meet): [`Lease::let_go`] waits for the last, so that what one found is not missed.
    pub releasing: u32,
    /// A release handed the lock to [`Lease::successor`].
    pub to_successor: bool,
}

pub(crate) struct Lease {
    pub id: u64,
    pub key: LockKey,
    pub token: String,
    pub fence: Option<u64>,
    pub options: LockOptions,
    /// When the acquisition reply arrived: the latest the server can have started the lease,
    /// so holds measured from here (`min_hold`) are never short.
    pub confirmed_at: Instant,
    /// When the attempt that took the lock was sent: the lease runs from here (for a handed
    /// over lock, from the attempt that kept the waiter's place, maybe long before the reply).
    pub started_at: Instant,
    /// A plain lock and one `Notify` rather than a `watch` channel: every acquisition makes a
    /// lease and every release drops one, and a watch channel (eight notifiers) cost about 4 %
    /// of a lock cycle's client CPU to make and drop.
    state: Mutex<LeaseState>,
    /// Woken on every change of `state`.
    changed: Notify,
    /// Whom this lease's measurements are about.
    pub labels: Labels,
    /// Its `lock.hold` span (see `spans`) until the lease is over: a guarded body runs in it,
    /// and its events belong to it. In an `Arc`, so the I/O thread hands it to the reporting
    /// thread without a call into the subscriber (cloning a `Span` is one).
    span: Mutex<Option<Arc<Span>>>,
    /// Renewals confirmed: for the span, and to know which renewals note how long the lock has
    /// been held ([`Renewal::note_held`]).
    renewals: AtomicU64,
    /// Told once how the lease ended, the moment it does (see [`Self::on_end`]).
    on_end: Mutex<Option<OnEnd>>,
    /// The identity of the candidate its release hands the lock to, where that one is in line
    /// (an election's hand-over).
    pub successor: OnceLock<String>,
}

/// What a lease tells its end to: an election's count of the terms it leads.
type OnEnd = Box<dyn FnOnce(LostReason) + Send>;

impl Lease {
    pub(crate) fn new(
        id: u64,
        key: LockKey,
        token: String,
        fence: Option<u64>,
        options: LockOptions,
        sent_at: Instant,
        labels: Labels,
    ) -> Arc<Self> {
        let state = Mutex::new(LeaseState {
            deadline: options.deadline(sent_at),
            lost: None,
            at_risk: false,
            body: false,
            step_down_by: None,
            forced: false,
            let_go: false,
            releasing: 0,
            to_successor: false,
        });
        Arc::new(Self {
            id,
            key,
            token,
            fence,
            options,
            confirmed_at: Instant::now(),
            started_at: sent_at,
            state,
            changed: Notify::new(),
            labels,
            span: Mutex::new(None),
            renewals: AtomicU64::new(0),
            on_end: Mutex::new(None),
            successor: OnceLock::new(),
        })
    }

    pub(crate) fn state(&self) -> LeaseState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` and wakes the watchers if it says it changed something.
    fn update(&self, change: impl FnOnce(&mut LeaseState) -> bool) -> bool {
        let changed = change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    /// Lost, or past the deadline without a confirmed renewal.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        let state = self.state();
        state
            .lost
            .or_else(|| (Instant::now() >= state.deadline).then(|| self.deadline_reason()))
    }

    fn deadline_reason(&self) -> LostReason {
        if !self.options.renew {
            LostReason::NotRenewed
        } else if self.max_hold_reached(Instant::now()) {
            LostReason::MaxHold
        } else {
            LostReason::Expired
        }
    }

    pub(crate) fn max_hold_reached(&self, now: Instant) -> bool {
        self.options
            .max_hold
            .is_some_and(|max| now >= self.confirmed_at + max)
    }

    /// A renewal sent at `sent_at` was confirmed by the server.
    ///
    /// A lease whose deadline has already passed stays lost even if the confirmation arrives
    /// late: its body may have been cancelled and its owner told, and a lease that comes back
    /// to life would make `is_lost` flap.
    pub(crate) fn confirm_renewal(&self, sent_at: Instant) {
        let deadline = self.options.deadline(sent_at);
        let now = Instant::now();
        let (mut lapsed, mut safe_again) = (false, false);
        if self.update(|s| {
            if s.lost.is_some() || deadline <= s.deadline {
                return false;
            }
            if now >= s.deadline {
                lapsed = true;
                return false;
            }
            s.deadline = deadline;
            safe_again = std::mem::take(&mut s.at_risk);
            true
        }) {
            self.renewals.fetch_add(1, Ordering::Relaxed);
        }
        if lapsed {
            self.mark_lost(self.deadline_reason());
        }
        if safe_again {
            let (key, fence) = (crate::error::shown(&self.key.name).to_string(), self.fence);
            let span = self.span_handle();
            report::tell(move || {
                tracing::info!(
                    parent: span.as_deref().and_then(|s| s.id()),
                    key,
                    fence,
                    "lock lease safe again: renewed"
                );
            });
        }
    }

    /// A renewal failed (`why`) or went unanswered for its budget while the lease still holds:
    /// it is in jeopardy until a renewal is confirmed (or it is lost).
    pub(crate) fn mark_at_risk(&self, why: &str) {
        let now = Instant::now();
        let mut left = Duration::ZERO;
        let newly = self.update(|s| {
            if s.lost.is_some() || s.at_risk || now >= s.deadline {
                return false;
            }
            s.at_risk = true;
            left = s.deadline - now;
            true
        });
        if newly {
            self.labels.at_risk();
            let (key, fence, why) = (
                crate::error::shown(&self.key.name).to_string(),
                self.fence,
                why.to_owned(),
            );
            let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            let span = self.span_handle();
            report::tell(move || {
                tracing::warn!(
                    parent: span.as_deref().and_then(|s| s.id()),
                    key,
                    fence,
                    left_ms,
                    why,
                    "lock lease at risk: not renewed yet"
                );
            });
        }
    }

    /// Whether the lease is at risk (see [`Self::mark_at_risk`]) and not lost.
    pub(crate) fn is_at_risk(&self) -> bool {
        let state = self.state();
        state.at_risk && state.lost.is_none() && Instant::now() < state.deadline
    }

    /// Resolves once [`Self::is_at_risk`] is `at_risk`, or the lease is lost.
    pub(crate) async fn wait_risk(&self, at_risk: bool) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.lost_reason().is_some() || self.is_at_risk() == at_risk {
                return;
            }
            let deadline = self.state().deadline;
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = changed => {}
            }
        }
    }

    /// Marks the lease lost (once; the first reason wins). Returns whether this call did it.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        // Taken before the loss ends the span, so the event is told inside it.
        let span = self.span_handle();
        let newly = self.set_lost(reason);
        if newly {
            let (key, fence) = (crate::error::shown(&self.key.name).to_string(), self.fence);
            report::tell(move || {
                tracing::warn!(
                    parent: span.as_deref().and_then(|s| s.id()),
                    key,
                    fence,
                    %reason,
                    "lock lease lost"
                );
            });
        }
        newly
    }

    /// This side ended the lease ([`LostReason::Released`]): every clone sees it over from now
    /// on. Called before the release that lets the next holder in is sent.
    pub(crate) fn end(&self) {
        self.set_lost(LostReason::Released);
    }

    fn set_lost(&self, reason: LostReason) -> bool {
        let newly = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.lost.is_none() && {
                state.lost = Some(reason);
                true
            }
        };
        if newly {
            // Counted outside the state's lock (the recorder is the application's code, and
            // may block), before anyone waiting for the loss is woken.
            if reason != LostReason::Released {
                self.labels.lost(reason);
            }
            self.changed.notify_waiters();
            self.end_span(Some(reason));
            self.ended(reason);
        }
        newly
    }

    /// Has `hook` told how the lease ended, once: when it ends (before the release that lets
    /// the next holder in is sent), at once if it already has, or when the lease is dropped
    /// unended.
    pub(crate) fn on_end(&self, hook: impl FnOnce(LostReason) + Send + 'static) {
        *self.on_end.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(hook));
        // An end that came first found no hook; whichever of the two takes it tells it.
        if let Some(reason) = self.state().lost {
            self.ended(reason);
        }
    }

    fn ended(&self, reason: LostReason) {
        let hook = self
            .on_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(hook) = hook {
            hook(reason);
        }
    }

    /// Gives the lease its `lock.hold` span, once the registry has admitted it.
    pub(crate) fn observe(&self, span: Span) {
        *self.span.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(span));
    }

    /// The `lock.hold` span while the lease lasts; a disabled span once it is over. Not on the
    /// I/O thread: cloning a span calls the subscriber (see [`Self::span_handle`]).
    pub(crate) fn span(&self) -> Span {
        self.hold_span()
            .map_or_else(Span::none, |span| Span::clone(&span))
    }

    /// The `lock.hold` span while the lease lasts, to tell an event in it from the reporting
    /// thread, and never to close it on the I/O thread (see [`report::Parting`]).
    fn span_handle(&self) -> Option<report::Parting<Arc<Span>>> {
        self.hold_span().map(report::Parting::new)
    }

    /// The `lock.hold` span while the lease lasts.
    fn hold_span(&self) -> Option<Arc<Span>> {
        self.span
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Ends the `lock.hold` span (once) with how the lease ended (see `spans::over`), told from
    /// the reporting thread when this is the I/O thread: the subscriber is the application's
    /// code, and may block. The span closes when its last handle goes: the guard's (see
    /// `LockGuard::finish`) or a body's still inside it.
    fn end_span(&self, ended: Option<LostReason>) {
        let span = self
            .span
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(span) = span.filter(|s| !s.is_disabled()).map(report::Parting::new) else {
            return;
        };
        let renewals = self.renewals.load(Ordering::Relaxed);
        report::tell(move || spans::over(&span, ended, renewals));
    }

    /// Marks a guarded body as running under this lease until the mark is dropped (see
    /// [`Self::body_gone`]).
    pub(crate) fn guarding(self: &Arc<Self>) -> BodyRuns {
        self.update(|s| !std::mem::replace(&mut s.body, true));
        BodyRuns(self.clone())
    }

    /// Resolves once no guarded body runs under this lease, or its deadline has passed (the key
    /// may then be gone on the server, and a release changes nothing any more).
    pub(crate) async fn body_gone(&self) {
        self.wait_for(|s| !s.body).await;
    }

    /// Resolves once `done` holds of the state, or the lease's deadline has passed.
    async fn wait_for(&self, done: impl Fn(&LeaseState) -> bool) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let state = self.state();
            if done(&state) || Instant::now() >= state.deadline {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(state.deadline) => {}
                () = changed => {}
            }
        }
    }

    /// Asks the work under this lease to wind down (an election's step-down) and be done by
    /// `by`, or sooner if an earlier call asked for sooner. Whether this call asked first.
    pub(crate) fn ask_to_step_down(&self, by: Instant) -> bool {
        let mut first = false;
        self.update(|s| {
            first = s.step_down_by.is_none();
            let by = s.step_down_by.map_or(by, |asked| asked.min(by));
            s.step_down_by.replace(by) != Some(by)
        });
        first
    }

    /// Whether the work was asked to wind down.
    pub(crate) fn is_stepping_down(&self) -> bool {
        self.state().step_down_by.is_some()
    }

    /// Resolves once the work was asked to wind down, or the lease is over.
    pub(crate) async fn stepping_down(&self) {
        self.wait_for(|s| s.step_down_by.is_some() || s.lost.is_some())
            .await;
    }

    /// Resolves once a step-down asks for its work by another time than `by`.
    pub(crate) async fn step_down_moved(&self, by: Instant) {
        self.wait_for(|s| s.step_down_by != Some(by)).await;
    }

    /// Ends the lease because a step-down's grace ran out (see [`LeaseState::forced`]).
    pub(crate) fn force_end(&self) {
        self.update(|s| !std::mem::replace(&mut s.forced, true));
        self.end();
    }

    /// Resolves once the lease is over on this side (lost, or ended for its release).
    pub(crate) async fn over(&self) {
        self.wait_for(|s| s.lost.is_some()).await;
    }

    /// Resolves once the store answered a release of the lease and no other is on its way, or
    /// the lease ran out.
    pub(crate) async fn let_go(&self) {
        self.wait_for(|s| s.let_go && s.releasing == 0).await;
    }

    /// Whether a release handed the lock to the lease's [`successor`](Self::successor).
    pub(crate) fn went_to_successor(&self) -> bool {
        self.state().to_successor
    }

    /// Releases the lease in the store (owner-checked): to its [`successor`](Self::successor)
    /// where one is named and in line, else as every release, and says so to whoever waits in
    /// [`Self::let_go`]. Whether the lock was still this lease's.
    pub(crate) async fn give_back(&self, backend: &Backend) -> Result<bool, LockError> {
        self.update(|s| {
            s.releasing += 1;
            false
        });
        // Counted out however this ends, also when the caller stops waiting.
        let _on_its_way = Releasing(self);
        let released = match self.successor.get() {
            Some(successor) => backend
                .release_to(&self.key, &self.token, successor)
                .await
                .map(|to| (to.is_some(), to == Some(true))),
            None => backend
                .release(&self.key, &self.token, self.options.share())
                .await
                .map(|released| (released, false)),
        };
        if let Ok((_, to_successor)) = released {
            self.update(|s| {
                s.let_go = true;
                // Never taken back: a second release (the holder's, after the keeper's) finds
                // the lease gone, which says nothing of where it went.
                s.to_successor |= to_successor;
                false
            });
        }
        released.map(|(released, _)| released)
    }

    pub(crate) fn lost_error(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            key: self.key.name.clone(),
            reason,
        }
    }

    /// Resolves when the lease is lost: reported by the keeper, or its deadline passed. Runs its
    /// own timer, so a keeper stuck on a slow Redis cannot delay the cancellation of a body.
    pub(crate) async fn wait_lost(&self) -> LostReason {
        loop {
            // Registered before the state is read, so a change in between is not missed.
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            // Lost, or past the deadline by the clock: not left to the timer, whose wheel lags
            // behind the clock after a stall (a process paused, a runtime blocked), so a sleep
            // until a deadline already passed would not be ready on this poll.
            if let Some(reason) = self.lost_reason() {
                self.mark_lost(reason);
                return self.state().lost.unwrap_or(reason);
            }
            // A renewal confirmed at the last moment moves the deadline: the loop looks again.
            tokio::select! {
                () = tokio::time::sleep_until(self.state().deadline) => {}
                () = changed => {}
            }
        }
    }

    /// One renewal per key this lease holds (a multi-key lock has several), each for `ttl`.
    pub(crate) fn renewals(&self, ttl: Duration) -> impl Iterator<Item = Renewal<'_>> {
        let share = self.options.share();
        let confirmed = self.renewals.load(Ordering::Relaxed);
        let note_held = (share == Share::Exclusive && confirmed.is_multiple_of(NOTE_HELD_EVERY))
            .then(|| ttl_ms(self.confirmed_at.elapsed()));
        self.key.keys().iter().map(move |key| Renewal {
            key,
            token: &self.token,
            ttl_ms: ttl_ms(ttl),
            share,
            fence: self.fence,
            note_held,
        })
    }

    /// How long `release` should keep the key for `min_hold`, if at all.
    pub(crate) fn min_hold_left(&self) -> Option<Duration> {
        let until = self.confirmed_at + self.options.min_hold?;
        until
            .checked_duration_since(Instant::now())
            .filter(|d| *d >= Duration::from_millis(1))
    }
}

impl Drop for Lease {
    /// A lease dropped before it was over (its registry went away with it) ends its span too.
    fn drop(&mut self) {
        let reason = self.lost_reason();
        self.end_span(reason);
        self.ended(reason.unwrap_or(LostReason::Released));
    }
}

/// A release of the lease is on its way to the store while this lives (see
/// [`Lease::give_back`]).
struct Releasing<'a>(&'a Lease);

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.update(|s| {
            s.releasing -= 1;
            true
        });
    }
}

/// A guarded body runs under the lease while this lives (see [`Lease::guarding`]).
pub(crate) struct BodyRuns(Arc<Lease>);

impl Drop for BodyRuns {
    fn drop(&mut self) {
        self.0.update(|s| std::mem::take(&mut s.body));
    }
}
