//! Leader election on a lock: candidates campaign for one key, the one holding it leads for a
//! term (numbered by its fencing token), and anyone can observe who leads.
//!
//! An election is a lock whose holders say who they are: a candidate's token starts with its
//! identity (see `token::new_token`), so a look at the key tells an observer who leads, and
//! the key's fencing counter numbers the terms. Candidates wait in the lock's queue, so a
//! leader that resigns hands over at once to the oldest; one that crashes is followed within
//! one ttl. An elected candidate announces itself on the key's channel (`backend::notification::ELECTED`),
//! where observers also hear every release: they look again only when something happened.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::acquisition::{self, held_as_lock};
use crate::backend::Store;
use crate::backoff::Backoff;
use crate::error::{LockError, LostReason};
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::lock::guarded;
use crate::metrics::ElectionLabels;
use crate::options::{LockOptions, OnLost};
use crate::state::RegistryInner;
use crate::token;

/// The longest identity: it is read back from the key by every observer.
const MAX_IDENTITY_BYTES: usize = 256;

/// One election: a key that candidates campaign for, and that observers watch. Built by
/// [`Registry::election`](crate::Registry::election); cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// let registry = lock_runtime::Registry::in_memory();
/// let election = registry
///     .election("scheduler")
///     .identity("10.0.0.5:8080")
///     .ttl(Duration::from_secs(10));
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("elected");
/// assert_eq!(leader.identity, "10.0.0.5:8080");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// assert_eq!(election.leader().await?, None);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<RegistryInner>,
    key: String,
    identity: String,
    ttl: Duration,
    pause: Duration,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.key)
            .field("identity", &self.identity)
            .field("ttl", &self.ttl)
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}

/// Who leads an election, as anyone sees it ([`Election::leader`], [`Observer::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The identity the leader campaigned with ([`Election::identity`]).
    pub identity: String,
    /// Its term: the fencing token it was elected with, greater than every earlier term's
    /// (see the crate's fencing section), read from the key's fencing counter, which the
    /// leader's renewals keep at its token for as long as the term lasts (a deleted one is put
    /// back at the next renewal; until then, and if anything but the library wrote the counter,
    /// it may be `None` or another number). `None` on Redlock, which offers no fencing tokens.
    pub term: Option<u64>,
    /// How long its lease lasts unless renewed: a leader that crashed is gone by then.
    pub remaining: Option<Duration>,
    /// How long this term has lasted, where the store knows it ([`LockInfo::held_for`]: on
    /// Redis, from the leader's first renewal on).
    ///
    /// [`LockInfo::held_for`]: crate::LockInfo::held_for
    pub led_for: Option<Duration>,
    /// The leader's tenure (`waiting::tenure_name` of its token): which term this is, also
    /// where no term numbers it.
    tenure: String,
}

impl Leader {
    /// Whether `self` and `other` are the same term of the same leader.
    fn same_term(&self, other: &Self) -> bool {
        self.tenure == other.tenure
    }
}

/// How a term ended on purpose ([`Election::step_down`], [`Election::hand_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SteppedDown {
    /// The term that ended (see [`Leader::term`]).
    pub term: Option<u64>,
    /// Whether its work ended within the grace (it returned, or its holder resigned); `false`
    /// when the grace ran out and the work was dropped, as on a lost term.
    pub finished: bool,
    /// Whether the term went to the candidate named in [`Election::hand_over`]; `false` when
    /// it went to the next candidate in line, or to nobody.
    pub to_successor: bool,
}

/// A term of leadership, won by [`Election::campaign`]. The lease keeper renews it while it
/// lives; [`resign`](Self::resign) hands it to the next candidate at once, and dropping it
/// resigns in the background.
#[must_use = "dropping a leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    term: Term,
}

impl Leadership {
    /// This term's number (see [`Leader::term`]).
    #[must_use]
    pub fn term(&self) -> Option<u64> {
        self.term.number()
    }

    /// This term, to hand to the leader's work: its number, and whether it is at risk or lost.
    #[must_use]
    pub fn of_term(&self) -> Term {
        self.term.clone()
    }

    /// The identity this leader campaigned with.
    #[must_use]
    pub fn identity(&self) -> &str {
        self.term.identity()
    }

    /// See [`Term::is_at_risk`].
    #[must_use]
    pub fn is_at_risk(&self) -> bool {
        self.term.is_at_risk()
    }

    /// See [`Term::is_lost`].
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.term.is_lost()
    }

    /// Runs `work` for this term, then resigns: one term of [`Election::lead`]'s loop. The
    /// work is dropped before the lease can expire if the term is lost, which returns
    /// [`LockError::Lost`] (converted with `E::from`), as a lock's body with
    /// `on_lost = "cancel"`; inside it, [`current()`](crate::current) is the term.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = lock_runtime::Registry::in_memory();
    /// let election = registry.election("compaction").identity("replica-2");
    /// let term = election
    ///     .campaign()
    ///     .await?
    ///     .run(async { Ok::<_, lock_runtime::LockError>(lock_runtime::current().unwrap().fence()) })
    ///     .await?;
    /// assert!(term.is_some());
    /// assert_eq!(election.leader().await?, None, "resigned when the work returned");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The work's own errors, and [`LockError::Lost`] when the term was lost.
    pub async fn run<T, E, F>(self, work: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        match guarded(self.guard, OnLost::Cancel, work).await {
            Ok(outcome) => outcome,
            Err(lost) => Err(lost.into()),
        }
    }

    /// Ends the term: the next candidate in line leads at once (where the store hands locks
    /// over; elsewhere the waiting candidates are woken).
    ///
    /// # Errors
    /// As [`LockGuard::release_now`]: [`LockError::NotOwner`] when the term was already over.
    pub async fn resign(self) -> Result<(), LockError> {
        self.guard.release_now().await
    }
}

/// A leader's term, as its work sees it: cheap to clone, also into tasks the work spawns.
#[derive(Clone)]
pub struct Term {
    lease: Arc<Lease>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("key", &self.lease.key.name)
            .field("identity", &self.identity())
            .field("number", &self.number())
            .finish_non_exhaustive()
    }
}

impl Term {
    /// The term's number: the fencing token the leader was elected with, to hand to the
    /// storage the leader writes to (`None` on Redlock).
    #[must_use]
    pub fn number(&self) -> Option<u64> {
        self.lease.fence
    }

    /// The election's key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.lease.key.name
    }

    /// The identity the leader campaigned with.
    #[must_use]
    pub fn identity(&self) -> &str {
        // A candidate's token always shows it (see `token::new_token`).
        token::identity_of(&self.lease.token).unwrap_or_default()
    }

    /// Whether the term's lease is at risk: a renewal failed or went unanswered while the
    /// lease still holds (see [`LockGuard::is_at_risk`]). A leader stops taking new work
    /// until [`out_of_risk`](Self::out_of_risk).
    #[must_use]
    pub fn is_at_risk(&self) -> bool {
        self.lease.is_at_risk()
    }

    /// Resolves when the term is at risk or lost; at once if it already is.
    pub async fn at_risk(&self) {
        self.lease.wait_risk(true).await;
    }

    /// Resolves when the term is no longer at risk (renewed, or lost).
    pub async fn out_of_risk(&self) {
        self.lease.wait_risk(false).await;
    }

    /// Whether the leader was asked to step down ([`Election::step_down`],
    /// [`Election::hand_over`]): its work stops taking new work and finishes what it has
    /// within the grace it was given, then returns (the term then goes to the next candidate).
    #[must_use]
    pub fn is_stepping_down(&self) -> bool {
        self.lease.is_stepping_down()
    }

    /// Resolves when the leader is asked to step down (see
    /// [`is_stepping_down`](Self::is_stepping_down)), or when the term is over; at once if
    /// either already happened.
    pub async fn stepping_down(&self) {
        self.lease.stepping_down().await;
    }

    /// Whether the term is over on this side: lost, resigned (also by its work returning), or
    /// past its deadline unconfirmed. Every clone sees a resignation before the next candidate
    /// can be elected.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// Resolves when the term is over (see [`is_lost`](Self::is_lost)), with the error that
    /// says why ([`LostReason::Released`] once it was resigned).
    pub async fn lost(&self) -> LockError {
        let reason = self.lease.wait_lost().await;
        self.lease.lost_error(reason)
    }
}

impl Election {
    pub(crate) fn new(inner: Arc<RegistryInner>, key: String) -> Self {
        let identity = inner.identity.clone();
        Self {
            inner,
            key,
            identity: identity.unwrap_or_else(token::default_identity),
            ttl: Duration::from_secs(10),
            pause: Duration::from_secs(1),
        }
    }

    /// What observers see of this candidate when it leads: its address, say (default: the
    /// registry's [`identity`](crate::RegistryBuilder::identity), else `host:pid`). Non-empty, at most 256 bytes, no control characters; anything else is
    /// [`LockError::InvalidOptions`] when campaigning.
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// The leader's lease (default 10 s): how long a crashed leader keeps the others waiting.
    /// Renewed every ttl/3 while the leader lives; see [`LockOptions::ttl`].
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`lead`](Self::lead) waits after a term ends before campaigning again
    /// (default 1 s): a leader whose work keeps failing lets another candidate try.
    #[must_use]
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// The election's key, as given.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> LockOptions {
        LockOptions::new()
            .ttl(self.ttl)
            .wait(Duration::MAX)
            .fencing(self.inner.backend.offers_fencing())
            .on_lost(OnLost::Cancel)
    }

    fn check_identity(&self) -> Result<(), LockError> {
        let reason = if self.identity.is_empty() {
            "an election's identity is empty: observers would see a leader without a name; \
             give each candidate one (its address, say) with `.identity(..)`"
                .to_owned()
        } else if self.identity.len() > MAX_IDENTITY_BYTES {
            format!(
                "an election's identity is {} bytes, beyond {MAX_IDENTITY_BYTES}: every \
                 observer reads it back; give a shorter one",
                self.identity.len()
            )
        } else if self.identity.chars().any(char::is_control) {
            format!(
                "the identity {:?} has control characters, which logs and terminals would \
                 mangle; give one without",
                self.identity
            )
        } else {
            return Ok(());
        };
        Err(LockError::InvalidOptions {
            key: self.key.clone(),
            reason,
        })
    }

    /// Campaigns until elected: waits in line behind the leader and earlier candidates (with
    /// no polling: a release hands over, or a notification wakes), riding out Redis being
    /// unreachable, and returns the term won.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad identity or ttl, or a key held as a lock
    /// (an election needs a key of its own); [`LockError::InvalidKey`] for a bad key;
    /// [`LockError::ShutDown`] once the registry was shut down.
    pub fn campaign(&self) -> impl Future<Output = Result<Leadership, LockError>> + Send + 'static {
        // Owns what it needs: a campaign can be spawned (`tokio::spawn(election.campaign())`).
        let this = self.clone();
        async move { this.elected().await }
    }

    async fn elected(&self) -> Result<Leadership, LockError> {
        self.check_identity()?;
        let lease = acquisition::acquire_lease(
            self.inner.clone(),
            vec![self.key.clone()],
            self.options(),
            Some(&self.identity),
        )
        .await?;
        // Guarded first: a campaign dropped while it announces still resigns.
        let leadership = Leadership {
            guard: LockGuard::new(self.inner.clone(), lease.clone()),
            term: Term {
                lease: lease.clone(),
            },
        };
        self.won(&lease);
        if let Err(error) = self.inner.backend.announce_taken(&lease.key).await {
            // Observers still see the new leader when the old lease ends, or at their next look.
            tracing::debug!(%error, "an elected leader's announcement failed");
        }
        tracing::info!(
            key = %crate::error::shown(&self.key),
            identity = %self.identity,
            term = lease.fence,
            "elected"
        );
        Ok(leadership)
    }

    /// Leads whenever elected, for as long as the registry is open: campaigns, runs `work`
    /// with the term won, and when the term ends campaigns again after [`pause`](Self::pause).
    /// A term ends when `work` returns (`Ok` or `Err`: it resigns, and the next candidate
    /// leads at once) or when its lease is lost, in which case `work` is dropped before the
    /// lease can expire on the server, as a lock's body with `on_lost = "cancel"` is.
    ///
    /// `work` is a service loop that normally never returns; it can watch
    /// [`Term::at_risk`] to stop taking new work while the lease is in doubt. Returns `Ok(())`
    /// once [`Registry::shutdown`](crate::Registry::shutdown) ended the term (the next
    /// candidate leads at once); drop the future to stop leading at any other moment.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = lock_runtime::Registry::in_memory();
    /// let election = registry.election("scheduler").identity("replica-1");
    /// let stop = registry.clone();
    /// election
    ///     .lead(|term| {
    ///         let stop = stop.clone();
    ///         async move {
    ///             assert_eq!(term.identity(), "replica-1");
    ///             // ... the leader's loop; here it ends by shutting the registry down ...
    ///             stop.shutdown().await;
    ///             std::future::pending::<Result<(), std::io::Error>>().await
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of [`campaign`](Self::campaign) that no wait changes, except
    /// [`LockError::ShutDown`], which ends the loop with `Ok(())`.
    pub async fn lead<F, Fut, E>(&self, mut work: F) -> Result<(), LockError>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        loop {
            let leadership = match self.campaign().await {
                Ok(leadership) => leadership,
                Err(LockError::ShutDown { .. }) => return Ok(()),
                Err(error) => return Err(error),
            };
            let term = leadership.of_term();
            let number = term.number();
            let ended = guarded(leadership.guard, OnLost::Cancel, work(term)).await;
            let key = crate::error::shown(&self.key);
            match ended {
                Ok(Ok(())) => tracing::info!(%key, term = number, "the leader's work returned"),
                Ok(Err(error)) => {
                    tracing::warn!(%key, term = number, %error, "the leader's work failed");
                }
                Err(LockError::Lost {
                    reason: LostReason::Shutdown,
                    ..
                }) => return Ok(()),
                Err(LockError::Lost {
                    reason: LostReason::Released,
                    ..
                }) => tracing::info!(%key, term = number, "the leader's work ran past its grace"),
                Err(error) => tracing::warn!(%key, term = number, %error, "leadership lost"),
            }
            if self.inner.ensure_open(&self.key).is_err() {
                return Ok(());
            }
            tokio::time::sleep(self.pause).await;
        }
    }

    /// Counts the term won, keeps it where [`is_leader`](Self::is_leader) looks, and counts
    /// it down the moment it ends.
    fn won(&self, lease: &Arc<Lease>) {
        let leading = {
            let mut elections = self
                .inner
                .terms
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Every election's: one whose key is never asked about again still lets go.
            elections.retain(|_, held| {
                held.terms
                    .retain(|term| term.upgrade().is_some_and(|term| still_counts(&term)));
                !held.terms.is_empty() || held.leading.load(Ordering::SeqCst) > 0
            });
            let held = elections.entry(self.key.clone()).or_default();
            held.terms.push(Arc::downgrade(lease));
            held.leading.fetch_add(1, Ordering::SeqCst);
            held.leading.clone()
        };
        let labels = ElectionLabels::new(self.inner.name(), &self.key);
        labels.won(&leading);
        lease.on_end(move |reason| {
            leading.fetch_sub(1, Ordering::SeqCst);
            labels.ended(reason, &leading);
        });
    }

    /// The terms of this election that candidates of this registry with this identity hold,
    /// or whose work still runs although they are over.
    fn held_here(&self) -> Vec<Arc<Lease>> {
        let elections = self
            .inner
            .terms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(held) = elections.get(&self.key) else {
            return Vec::new();
        };
        held.terms
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|term| {
                still_counts(term)
                    && token::identity_of(&term.token) == Some(self.identity.as_str())
            })
            .collect()
    }

    /// The term a candidate of this registry holds in this election under this
    /// [`identity`](Self::identity), while it lasts: from its election until it is resigned or
    /// lost (every clone of the term sees it over at the same moment).
    #[must_use]
    pub fn term(&self) -> Option<Term> {
        self.held_here()
            .into_iter()
            .find(|lease| lease.lost_reason().is_none())
            .map(|lease| Term { lease })
    }

    /// Whether this process leads the election now (see [`term`](Self::term)): a
    /// leader-only service's readiness. A standby is healthy but not ready, so an orchestrator
    /// routes to the leader alone, and never restarts a standby for being one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = lock_runtime::Registry::in_memory();
    /// let election = registry.election("scheduler").identity("replica-1");
    /// assert!(!election.is_leader());
    /// let leadership = election.campaign().await?;
    /// assert!(election.is_leader() && election.is_live());
    /// leadership.resign().await?;
    /// assert!(!election.is_leader() && election.is_live(), "a standby again");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// A leader-only service's liveness: `false` while this process leads with its term
    /// [at risk](Term::is_at_risk), or while the work of a term that is over still runs (a
    /// term's work is dropped when the term is lost, so work that outlives it is blocked: only a
    /// restart stops it). `true` otherwise, standbys included.
    ///
    /// A term at risk is decided within its ttl: renewed (live again), or lost (a standby,
    /// live again). Let the probe fail for longer than the election's ttl before restarting,
    /// so a store that answers late costs no restart; a blocked term's work fails it for good.
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.held_here()
            .iter()
            .all(|lease| match lease.lost_reason() {
                None => !lease.is_at_risk(),
                Some(_) => !lease.state().body,
            })
    }

    /// Steps down from the term this process holds in this election (see
    /// [`term`](Self::term)), on purpose: a rolling deploy's leader, say. Its work is told
    /// ([`Term::stepping_down`]: stop taking new work, finish what it has, return); when it
    /// returns, or when `grace` has passed (then work run by [`Leadership::run`] or
    /// [`lead`](Self::lead) is dropped, as on a lost term, and a term held by hand is over for
    /// its holder: [`Term::is_lost`]), the term is resigned and the next candidate in line leads
    /// at once: never before the work returned or was dropped. Returns once the store has the
    /// term back (or its lease ran out), with how it ended; `None` when this process did not
    /// lead. A [`lead`](Self::lead) loop campaigns again afterwards, from the back of the line:
    /// stop it (or shut the registry down) to leave.
    ///
    /// A term steps down once. A second call for the same term (a step-down or a hand-over)
    /// joins the first: the earliest end of a grace applies, the first successor named wins,
    /// and each call returns when the term is over. Dropping the returned future stops waiting,
    /// not the step-down, which goes on in the background. Called from inside the term's own
    /// work, which it would wait for, it is refused: return from the work instead.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let registry = lock_runtime::Registry::in_memory();
    /// let election = registry.election("scheduler").identity("replica-1");
    /// let leading = tokio::spawn(election.campaign().await?.run(async {
    ///     let term = lock_runtime::current().expect("leading");
    ///     term.stepping_down().await; // ... serving until asked to stop ...
    ///     Ok::<_, lock_runtime::LockError>("finished") // ... then finishing what it has
    /// }));
    /// let ended = election.step_down(Duration::from_secs(30)).await?.expect("it led");
    /// assert!(ended.finished);
    /// assert_eq!(leading.await.unwrap()?, "finished");
    /// assert_eq!(election.leader().await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when called from inside the term's own work (nothing is
    /// asked). A failed release is retried in the background until the store answers or the
    /// lease runs out, as every release is.
    pub async fn step_down(&self, grace: Duration) -> Result<Option<SteppedDown>, LockError> {
        self.leave(None, grace).await
    }
    /// As [`step_down`](Self::step_down), but the term goes to the candidate campaigning as
    /// `successor` (its [`identity`](Self::identity)) ahead of the others in line, where it is
    /// still in line when the term ends; otherwise to the next candidate, as a step-down
    /// ([`SteppedDown::to_successor`] says which). `None` when this process did not lead.
    ///
    /// # Errors
    /// [`LockError::NotInLine`] when `successor` is not waiting in line now (nothing was
    /// changed: the leader goes on); [`LockError::InvalidOptions`] on Redlock, whose
    /// candidates race rather than wait in a line, and as [`step_down`](Self::step_down); as
    /// [`in_line`](Self::in_line) when the look at the line fails.
    pub async fn hand_over(
        &self,
        successor: &str,
        grace: Duration,
    ) -> Result<Option<SteppedDown>, LockError> {
        if !self.inner.backend.hands_over() {
            return Err(LockError::InvalidOptions {
                key: self.key.clone(),
                reason: format!(
                    "cannot hand the term to {successor:?}: on {}, candidates do not wait in a \
                     line to hand it to; step down instead, and the candidates race for it",
                    self.inner.backend.node()
                ),
            });
        }
        if self.term().is_none() {
            return Ok(None);
        }
        if !self.in_line().await?.iter().any(|c| c == successor) {
            return Err(LockError::NotInLine {
                key: self.key.clone(),
                candidate: successor.to_owned(),
            });
        }
        self.leave(Some(successor), grace).await
    }

    /// Ends the term held here: asks its work to wind down by the end of `grace`, then waits
    /// for the term's end, which the first call's [`drive_step_down`] brings about.
    async fn leave(
        &self,
        successor: Option<&str>,
        grace: Duration,
    ) -> Result<Option<SteppedDown>, LockError> {
        let Some(lease) = self.term().map(|term| term.lease) else {
            return Ok(None);
        };
        if crate::current::runs_inside(&lease) {
            return Err(LockError::InvalidOptions {
                key: self.key.clone(),
                reason: "a step-down was asked from inside the term's own work, which it would \
                         wait for: return from the work instead (the term is resigned then), or \
                         spawn the step-down (`tokio::spawn`) and then return"
                    .to_owned(),
            });
        }
        // The first name given is the successor: a later hand-over of the same term joins it.
        let named = successor.is_some_and(|successor| {
            let _ = lease.successor.set(successor.to_owned());
            lease.successor.get().map(String::as_str) == Some(successor)
        });
        let now = Instant::now();
        let by = now
            .checked_add(grace)
            .unwrap_or(now + crate::options::NO_DEADLINE);
        if lease.ask_to_step_down(by) {
            // Its own task: a caller that stops waiting stops waiting, not the step-down.
            tokio::spawn(drive_step_down(self.inner.clone(), lease.clone()));
        }
        lease.let_go().await;
        let state = lease.state();
        let ended = SteppedDown {
            term: lease.fence,
            finished: state.lost == Some(LostReason::Released) && !state.forced,
            to_successor: named && lease.went_to_successor(),
        };
        tracing::info!(
            key = %crate::error::shown(&self.key),
            term = ended.term,
            finished = ended.finished,
            successor = lease.successor.get(),
            to_successor = lease.went_to_successor(),
            "stepped down"
        );
        Ok(Some(ended))
    }

    /// The identities of the candidates waiting in line, the next leader first: those a
    /// [`hand_over`](Self::hand_over) can name. Empty on Redlock, whose candidates do not
    /// queue.
    ///
    /// # Errors
    /// As [`leader`](Self::leader).
    pub async fn in_line(&self) -> Result<Vec<String>, LockError> {
        Ok(self.line().await?.0)
    }

    /// The candidates standing aside ([`stand_aside`](Self::stand_aside)) with their places
    /// kept, oldest first: in line, but passed over until they rejoin. Empty where candidates
    /// do not queue.
    ///
    /// # Errors
    /// As [`leader`](Self::leader).
    pub async fn standing_aside(&self) -> Result<Vec<String>, LockError> {
        Ok(self.line().await?.1)
    }

    /// The identities queued for the term: those that can be handed it, then those standing
    /// aside.
    async fn line(&self) -> Result<(Vec<String>, Vec<String>), LockError> {
        let key = self.inner.lock_key(self.key.clone())?;
        let info = self.inner.backend.inspect(&key).await?;
        let (mut ready, mut aside) = (Vec::new(), Vec::new());
        for place in &info.queue {
            if let Some(identity) = token::identity_of(&place.token) {
                let line = if place.aside { &mut aside } else { &mut ready };
                line.push(identity.to_owned());
            }
        }
        Ok((ready, aside))
    }

    /// Stands aside: this registry's candidates in this election under this
    /// [`identity`](Self::identity) (draining, or unhealthy) are not elected until they
    /// [`rejoin`](Self::rejoin), from the moment this returns. Where candidates wait in a line
    /// (not Redlock or `confirm_replicas`) each keeps its place, and every handoff passes it
    /// over to the next candidate; elsewhere it stops campaigning until it rejoins. A term
    /// handed to it as it stood aside goes on to the next candidate at once, and its work never
    /// starts. A term it leads now goes on: end it with [`step_down`](Self::step_down) (a
    /// [`lead`](Self::lead) loop then campaigns again, standing aside).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let registry = lock_runtime::Registry::in_memory();
    /// let leader = registry.election("scheduler").identity("replica-1").campaign().await?;
    /// let draining = registry.election("scheduler").identity("replica-2");
    /// let standby = tokio::spawn(draining.campaign());
    /// # while draining.in_line().await?.is_empty() { tokio::task::yield_now().await; }
    /// draining.stand_aside();
    /// # while draining.standing_aside().await?.is_empty() { tokio::task::yield_now().await; }
    /// assert_eq!(draining.standing_aside().await?, ["replica-2"]);
    /// leader.resign().await?; // passed over: nobody else is in line, so nobody leads
    /// assert_eq!(draining.leader().await?, None);
    /// draining.rejoin();
    /// let elected = standby.await.unwrap()?;
    /// assert_eq!(elected.identity(), "replica-2");
    /// # Ok(()) }
    /// ```
    pub fn stand_aside(&self) {
        self.inner.set_aside(&self.key, &self.identity, true);
    }

    /// Ends [`stand_aside`](Self::stand_aside): this registry's candidates under this identity
    /// take their places in line again at once (where their places were kept, where they
    /// were), and may be elected.
    pub fn rejoin(&self) {
        self.inner.set_aside(&self.key, &self.identity, false);
    }

    /// Whether this registry's candidates under this identity stand aside.
    #[must_use]
    pub fn is_standing_aside(&self) -> bool {
        *self.inner.aside(&self.key, &self.identity).borrow()
    }

    /// Who leads now, in one look at the key; `None` while nobody does (a crashed leader's
    /// lease has not ended yet: it still shows).
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key;
    /// [`LockError::InvalidOptions`] when the key is held as a lock, not by a candidate.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let key = self.inner.lock_key(self.key.clone())?;
        let info = self.inner.backend.inspect(&key).await?;
        let Some(owner) = info.owner else {
            if info.readers.is_some() || info.permits.is_some() {
                return Err(held_as_lock(&self.key));
            }
            return Ok(None);
        };
        let Some(identity) = token::identity_of(&owner) else {
            return Err(held_as_lock(&self.key));
        };
        Ok(Some(Leader {
            identity: identity.to_owned(),
            term: info.fence,
            remaining: info.remaining,
            led_for: info.held_for,
            tenure: crate::waiting::tenure_name(&owner),
        }))
    }

    /// Follows who leads: see [`Observer`].
    #[must_use]
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            seen: None,
            leaderless_since: None,
        }
    }
}

/// Follows an election's leader: [`next`](Self::next) says who leads, then waits for each
/// change (a new leader, a new term, or none once a crashed leader's lease ended). Woken by
/// the key's notifications, as waiters are: it looks at the key only when something happened,
/// when the leader's lease would end, or, while nobody leads, once per the election's
/// [`ttl`](Election::ttl), so a lost notification hides a new leader for at most that long.
#[derive(Debug)]
pub struct Observer {
    election: Election,
    /// The leader last returned; `None` before the first call.
    seen: Option<Option<Leader>>,
    /// Since when this observer has seen nobody lead (for `distributed_lock_leaderless_seconds`).
    leaderless_since: Option<Instant>,
}

impl Observer {
    /// Who leads now on the first call; afterwards, who leads once that changed. Errors are
    /// returned as they happen (Redis unreachable, say); calling again goes on observing.
    ///
    /// # Errors
    /// As [`Election::leader`].
    pub async fn next(&mut self) -> Result<Option<Leader>, LockError> {
        let election = &self.election;
        let key = election.inner.lock_key(election.key.clone())?;
        let hub = election.inner.backend.hub();
        let far = Instant::now() + crate::options::NO_DEADLINE;
        let interest = hub.interest(key.channel(), far).await;
        let mut backoff = Backoff::new();
        loop {
            // Enabled before the look: news that arrives during it still wakes this wait.
            let mut news = std::pin::pin!(interest.news());
            news.as_mut().enable();
            let looked_at = Instant::now();
            let now = election.leader().await?;
            match (&now, self.leaderless_since) {
                (None, None) => self.leaderless_since = Some(looked_at),
                (Some(_), Some(since)) => {
                    self.leaderless_since = None;
                    ElectionLabels::new(election.inner.name(), &election.key)
                        .leaderless(looked_at.saturating_duration_since(since));
                }
                _ => {}
            }
            let changed = match &self.seen {
                None => true,
                Some(None) => now.is_some(),
                Some(Some(seen)) => now.as_ref().is_none_or(|now| !now.same_term(seen)),
            };
            if changed {
                self.seen = Some(now.clone());
                return Ok(now);
            }
            // A lost notification costs at most the leader's lease; with nobody leading, at
            // most the election's ttl (a new leader's lost announcement, say).
            let mut wake_at = match &now {
                Some(leader) => leader
                    .remaining
                    .map_or(far, |left| looked_at + left + Duration::from_millis(1)),
                None => looked_at + election.ttl,
            };
            if !interest.notified_by_server() {
                wake_at = wake_at.min(Instant::now() + backoff.next_pause());
            }
            tokio::select! {
                () = news => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }
}

/// Brings a step-down about: once the term is over (its work returned, its holder resigned, or
/// it was lost) there is nothing to do; when the earliest grace asked runs out first, the term
/// is ended here, so that its work is dropped and its guard resigns it (a term held by hand,
/// with no work to drop, the keeper resigns).
async fn drive_step_down(inner: Arc<RegistryInner>, lease: Arc<Lease>) {
    loop {
        let Some(by) = lease.state().step_down_by else {
            return;
        };
        tokio::select! {
            () = lease.over() => return,
            () = lease.step_down_moved(by) => {}
            () = tokio::time::sleep_until(by) => break,
        }
    }
    lease.force_end();
    if !lease.state().body {
        inner.keeper.begin_release(lease.id);
        inner.keeper.release_in_background(lease.id);
    }
}

/// Whether a term won here still counts for [`Election::is_leader`] or
/// [`Election::is_live`]: not over, or its work still runs.
fn still_counts(term: &Lease) -> bool {
    term.lost_reason().is_none() || term.state().body
}
