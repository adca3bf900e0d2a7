//! The contract every store keeps: what an attempt asks and gets, what a renewal finds, and
//! the operations themselves ([`Store`]).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LockError;
use crate::io::Home;
use crate::key::LockKey;
pub(crate) use crate::options::Share;
use crate::waiting::WaitHub;

/// How long a fencing counter outlives the lease of the holder that last took or kept it: one
/// day, so per-entity counters do not pile up. A counter's expiry costs no safety (the next
/// token is at least the server's clock in microseconds), only the number `inspect` shows
/// between holders; a held fenced lock keeps its counter (see `Renewal::fence`). `prelude.lua` of
/// the Redis scripts spells the same number; a test holds the two equal.
pub(crate) const FENCE_EXPIRY_MS: u64 = 24 * 3600 * 1000;

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours; with the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Someone else's; with the holder's remaining lease (`None`: the key has no expiry) and
    /// token, where the store reports it (a plain `SET NX` refusal does not).
    Busy {
        retry_after: Option<Duration>,
        holder: Option<String>,
        /// Which of a multi-key lock's keys is taken (0 for a single key).
        at: usize,
    },
}

/// What a renewal found for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still ours; its expiry was set again.
    Yes,
    /// No key at all: it expired on the server or was deleted.
    Gone,
    /// Someone else's token (or another kind of value) is under the key.
    Taken,
}

impl Renewed {
    /// A multi-key lock's outcome from its keys' (`None`: unknown): lost when any key is
    /// (taken before gone), renewed only when every key is, else (or with no answers) unknown.
    pub(crate) fn of_all(found: &[Option<Renewed>]) -> Option<Renewed> {
        if found.is_empty() {
            return None;
        }
        [Renewed::Taken, Renewed::Gone]
            .into_iter()
            .find(|lost| found.contains(&Some(*lost)))
            .or_else(|| {
                found
                    .iter()
                    .all(|f| *f == Some(Renewed::Yes))
                    .then_some(Renewed::Yes)
            })
    }
}

/// One acquisition attempt.
pub(crate) struct Acquire<'a> {
    pub key: &'a LockKey,
    /// The owner token. An acquisition keeps it across attempts (a retry after a lost reply
    /// finds its own token and takes the lock rather than waiting for itself), unless its store
    /// undoes failed attempts in the background (Redlock).
    pub token: &'a str,
    pub ttl: Duration,
    /// Take a fencing token with the lock.
    pub fencing: bool,
    /// Which attempt of its acquisition this is, from 1. The first usually finds the lock free;
    /// later ones (while waiting) go straight to the script that also reports the holder's
    /// lease. A queued waiter's place is named by the attempt that took or last kept it, and a
    /// release that hands the lock over names that place back (see `waiting::Grant`).
    pub attempt: u32,
    /// Queue up when busy, where the store hands locks over (see `RELEASE_LUA`): set while the
    /// caller is prepared to wait.
    pub queue: bool,
    /// The caller waits when the lock is busy: a busy reply marks the holder's value, so that
    /// its release wakes whoever waits (an unmarked one is a plain delete).
    pub waits: bool,
    /// Other tasks of this process wait for the lock (one release wakes one of them): taken,
    /// it is marked at once, so that its release wakes the next.
    pub others_wait: bool,
    /// The lock itself, a read lock or a permit.
    pub share: Share,
    /// When the caller stops waiting: a store may hold an attempt back until then (Redlock's
    /// turns), never longer.
    pub give_up_at: Instant,
    /// The caller is an election's candidate standing aside (see [`Store::stands_aside`]):
    /// it keeps its place, passed over by every handoff, and never takes the lock; one handed
    /// to it as it stood aside goes on to the next in line.
    pub aside: bool,
}

impl Acquire<'_> {
    /// Whether the attempt starts with a plain `SET NX PX`: an exclusive lock's first attempt
    /// without fencing, which usually finds the lock free, unless others here wait for it.
    pub(crate) fn plain_set_first(&self) -> bool {
        self.attempt == 1
            && !self.fencing
            && self.share == Share::Exclusive
            && !self.others_wait
            && !self.aside
    }
}

/// One lock in a renewal batch.
#[derive(Clone, Copy)]
pub(crate) struct Renewal<'a> {
    /// One key (of a multi-key lock, one of its keys).
    pub key: &'a LockKey,
    pub token: &'a str,
    pub ttl_ms: u64,
    /// How the lock is held (Redlock needs more nodes to keep a permit).
    pub share: Share,
    /// A fenced lock's token: the renewal keeps the key's counter at least a day beyond the
    /// lease, put back at the token if it is gone, so that it names the holder's term for as
    /// long as the lock is held (`hold_fence` in the scripts' prelude).
    pub fence: Option<u64>,
    /// How long the lock has been held (by the client's clock, from the acquisition's reply),
    /// on the renewals that note it beside the lock for `inspect`'s [`LockInfo::held_for`]:
    /// the first of an exclusive hold and every [`NOTE_HELD_EVERY`]th after. A Redis store
    /// renews a lock with a native command only on the others.
    pub note_held: Option<u64>,
}

/// A hold's first renewal notes how long it has been held, and every this many confirmed
/// renewals after, the note is kept: it lasts `HELD_NOTE_TTLS` ttls (the Redis scripts'
/// prelude), more than the renewals between two notes take, each less than a ttl apart.
pub(crate) const NOTE_HELD_EVERY: u64 = 32;

/// What `inspect` finds under a key. Fields may be added: read them, or start from
/// [`LockInfo::default`] (a free lock) to build one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's token (`host:pid:random`), `None` when the lock is free or held shared.
    pub owner: Option<String>,
    /// The remaining lease (held shared: of the last reader or permit to expire), `None` when
    /// free or without expiry.
    pub remaining: Option<Duration>,
    /// How long the owner has held the lock, where the store knows it: Postgres and the
    /// in-memory store from the moment it was taken or handed over; Redis from the owner's
    /// first renewal on (its renewals write it beside the lock, see
    /// [`protocol`](crate::protocol)), so a lock held for less than one renewal interval (a
    /// third of its ttl), one taken with renewal off, or one held by a client that does not
    /// renew through this library, shows `None`. `None` too when the
    /// lock is free or held shared.
    pub held_for: Option<Duration>,
    /// The last fencing token handed out for this key: while a fenced holder holds it, that
    /// holder's token (its renewals keep the counter), else while the counter lives (a day
    /// beyond the last fenced holder's lease).
    pub fence: Option<u64>,
    /// For a semaphore: its permits, and how many are held now.
    pub permits: Option<Permits>,
    /// For a read-write lock held by readers: how many.
    pub readers: Option<u32>,
    /// Callers queued for the lock, each to be handed it in turn (places whose owner stopped
    /// renewing them do not count): the length of [`queue`](Self::queue). Always 0 on Redlock,
    /// whose waiters do not queue.
    pub waiters: u32,
    /// The queued callers in the order they will be handed the lock (the next one first), each
    /// with how long its place holds unless its waiter renews it. Empty on Redlock.
    pub queue: Vec<Place>,
    /// Held shared: each reader or permit holder with its remaining lease, the longest first
    /// (on Redlock, the holders a quorum of nodes agrees on). Empty when the lock is free or
    /// held by one owner ([`owner`](Self::owner) and [`remaining`](Self::remaining) say it).
    pub holders: Vec<Place>,
}

impl LockInfo {
    /// A key held shared as `share` by `holders`: they are listed the longest lease first, the
    /// longest is the key's remaining lease, and the permits or readers are counted.
    pub(crate) fn held_shared(&mut self, share: Share, mut holders: Vec<Place>) {
        let held = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        holders.sort_by_key(|p| std::cmp::Reverse(p.remaining));
        self.remaining = holders.first().map(|p| p.remaining);
        self.holders = holders;
        self.permits = match share {
            Share::Permits(total) => Some(Permits { held, total }),
            Share::Read | Share::Exclusive => None,
        };
        self.readers = (share == Share::Read).then_some(held);
    }
}

/// A queued caller's place, or a shared holder's lease, as [`LockInfo`] reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Place {
    /// Its token (`host:pid:random`; a candidate's starts with `identity@`). Whoever has it can
    /// release or extend what it holds: show it shortened.
    pub token: String,
    /// How long the place or lease holds without renewal.
    pub remaining: Duration,
    /// A queued election candidate standing aside ([`Election::stand_aside`]): it keeps its
    /// place, and every handoff passes it over until it rejoins.
    ///
    /// [`Election::stand_aside`]: crate::Election::stand_aside
    pub aside: bool,
}

impl Place {
    /// A place held by `token` for `remaining`.
    #[must_use]
    pub fn new(token: impl Into<String>, remaining: Duration) -> Self {
        Self {
            token: token.into(),
            remaining,
            aside: false,
        }
    }

    /// This place, standing aside or not (see [`aside`](Self::aside)).
    #[must_use]
    pub fn standing_aside(mut self, aside: bool) -> Self {
        self.aside = aside;
        self
    }
}

/// A semaphore's permits, as [`LockInfo`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permits {
    /// Permits held now (by live leases).
    pub held: u32,
    /// The semaphore's size, as its holders named it.
    pub total: u32,
}

/// What every store does: Redis (one deployment), Redlock (several) and memory.
///
/// Every operation is owner-checked except [`force_unlock`](Self::force_unlock): a lock is
/// never released or extended by anyone but the holder of its token.
///
/// What a store may or may not offer is a provided method whose default is the cautious answer
/// (no fencing, no handoff, no replicas to confirm): a new store claims each capability it
/// keeps, and one that claims nothing is still correct.
pub(crate) trait Store: Send + Sync {
    /// `host:port` (never credentials), for errors and traces.
    fn node(&self) -> &str;

    /// Where the waiters for this store's locks are woken.
    fn hub(&self) -> &WaitHub;

    /// Where this store's background work (renewals, background releases) runs: the I/O
    /// thread, unless the store needs no I/O.
    fn home(&self) -> Home {
        Home::Io
    }

    /// Refuses a key this store cannot hold as asked (a Redis Cluster's keys of one lock must
    /// share a hash slot, say), with a reason that says what to write instead.
    fn admit(&self, _key: &LockKey) -> Result<(), LockError> {
        Ok(())
    }

    /// Whether fencing tokens are offered: only where one counter serves every holder, so that
    /// a token only grows.
    fn offers_fencing(&self) -> bool {
        false
    }

    /// Whether a release hands the lock straight to the oldest waiter that queued up (see
    /// [`Acquire::queue`]); otherwise waiters are woken and race.
    fn hands_over(&self) -> bool {
        false
    }

    /// Whether a queued candidate can stand aside ([`Acquire::aside`]): keep its place while
    /// every handoff passes it over. Elsewhere a candidate standing aside leaves the line.
    fn stands_aside(&self) -> bool {
        false
    }

    /// Whether a failed attempt is taken back in the background (Redlock's undo). The next
    /// attempt then needs a token of its own: with the same one, a late undo could delete what
    /// it won.
    fn undoes_failed_attempts(&self) -> bool {
        false
    }

    /// Whether a holder can make its own transaction in the store commit only while the lock
    /// is held (`TransactionCheck`): Postgres.
    fn checks_transactions(&self) -> bool {
        false
    }

    /// How many replicas must acknowledge each acquisition and renewal (0: none).
    fn confirm_replicas(&self) -> u32 {
        0
    }

    /// An operator's owner-checked force-unlock: as [`release`](Self::release), but where a lock
    /// lives on several servers it returns only once every one answered or timed out, so that a
    /// short-lived process (`lockctl unlock`) leaves no copy behind when it exits.
    fn release_everywhere(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        self.release(key, token, share)
    }

    /// Takes the lock if it is free (or already held with this token).
    fn acquire(
        &self,
        attempt: &Acquire<'_>,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// Deletes the lock if it is still ours and wakes waiters; `Ok(false)` if it was not ours.
    /// `share`: how it was taken (a store may release a lock held alone more cheaply).
    fn release(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// As [`release`](Self::release) of a lock of one key held alone, but where the release hands the lock
    /// over, it goes to the live queued candidate that campaigns as `successor` (the identity
    /// of `token::identity_of`), ahead of any waiting before it; with no such candidate in
    /// line, to the oldest live waiter as ever. `Ok(None)`: the lock was not ours;
    /// `Ok(Some(true))`: it went to `successor`. A store that does not hand locks over only
    /// releases.
    fn release_to(
        &self,
        key: &LockKey,
        token: &str,
        successor: &str,
    ) -> impl Future<Output = Result<Option<bool>, LockError>> + Send {
        let _ = successor;
        async move {
            let released = self.release(key, token, Share::Exclusive).await?;
            Ok(released.then_some(false))
        }
    }

    /// Sets the expiry of each lock that is still ours. Per lock: what the store found, or
    /// `None` when unknown (that part of the batch failed; retry). Each call to a node is
    /// bounded by `budget`, so one dead node cannot hold back what live nodes confirm.
    fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> impl Future<Output = Result<Vec<Option<Renewed>>, LockError>> + Send;

    /// Who holds `key`, for how much longer, and its last fencing token.
    fn inspect(&self, key: &LockKey) -> impl Future<Output = Result<LockInfo, LockError>> + Send;

    /// Tells whoever observes `key` that its lock was just taken (an elected candidate's news,
    /// `backend::notification::ELECTED`): a lock taken free is announced by no release.
    fn announce_taken(&self, key: &LockKey) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Deletes whatever lock is under `key` (an operator's decision) and wakes its waiters.
    fn force_unlock(&self, key: &LockKey) -> impl Future<Output = Result<bool, LockError>> + Send;
}

/// Milliseconds for `PX`/`PEXPIRE`, at least 1 (0 would be an error or mean "delete now").
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::Renewed::{self, Gone, Taken, Yes};

    #[test]
    fn a_multi_key_lease_is_renewed_only_when_every_key_is() {
        assert_eq!(Renewed::of_all(&[Some(Yes), Some(Yes)]), Some(Yes));
        assert_eq!(Renewed::of_all(&[Some(Yes), None]), None, "one key unknown");
        assert_eq!(
            Renewed::of_all(&[None, Some(Gone)]),
            Some(Gone),
            "lost beats unknown"
        );
        assert_eq!(Renewed::of_all(&[Some(Gone), Some(Taken)]), Some(Taken));
        assert_eq!(Renewed::of_all(&[]), None, "no answer is no renewal");
    }
}
