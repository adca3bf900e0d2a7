//! What a lock request asks for: lease length, waiting, renewal and hold bounds.

use std::time::Duration;

use crate::error::LockError;

/// What happens to a guarded body when its lease can no longer be guaranteed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Drop the body future before the key can expire on the server and return
    /// [`LockError::Lost`].
    #[default]
    Cancel,
    /// Let the body finish; the loss is reported through `tracing` and
    /// [`CurrentLock::is_lost`](crate::CurrentLock::is_lost).
    Continue,
}

/// Which side of a read-write lock a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Alone: no other writer and no reader (every plain lock is a write lock).
    #[default]
    Write,
    /// Beside any number of other readers, while no writer holds the key or waits for it.
    Read,
}

/// The options of one lock request. `const` so the attribute can build them at compile time.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockOptions;
///
/// let options = LockOptions::new().ttl(Duration::from_secs(60)).wait(Duration::from_secs(5));
/// assert_eq!(options.get_ttl(), Duration::from_secs(60));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) renew: bool,
    pub(crate) on_lost: OnLost,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fencing: bool,
    pub(crate) permits: Option<u32>,
    pub(crate) mode: Mode,
    pub(crate) template: Option<&'static str>,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// Redis takes `PX` as a signed 64-bit count of milliseconds; leases beyond a year are a bug.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a wait without a deadline waits (`Duration::MAX`, a campaign): a century, which stays
/// within the clock's range.
pub(crate) const NO_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The shortest lease: the local deadline is ttl minus drift (ttl/100 + 2 ms), which must leave
/// room for a round trip and a renewal at ttl/3. At 10 ms that is 7.9 ms of validity.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(10);

impl LockOptions {
    /// ttl 30 s, no waiting, renewal on, cancel on loss, no hold bounds, no fencing.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            renew: true,
            on_lost: OnLost::Cancel,
            min_hold: None,
            max_hold: None,
            fencing: false,
            permits: None,
            mode: Mode::Write,
            template: None,
        }
    }

    /// Lease length: how long the lock outlives a holder that crashed without releasing.
    /// From 10 ms (the lease's local deadline is ttl minus a drift margin of ttl/100 + 2 ms, so
    /// a shorter one would be lost at once) to 365 days; anything else is
    /// [`LockError::InvalidOptions`] when the lock is requested.
    #[must_use]
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for a busy lock; zero tries once (and never queues).
    ///
    /// Waiters are served first come, first served: a busy attempt takes a place in the lock's
    /// queue, and the holder's release hands the lock straight to the oldest live waiter
    /// (single server, Sentinel, Cluster and memory; not Redlock or `confirm_replicas`, whose
    /// waiters are woken and retry). A waiter that gives up or is cancelled leaves the queue.
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the lease keeper renews the lock while it is held (on by default).
    #[must_use]
    pub const fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// What a guarded body does when the lease is lost.
    #[must_use]
    pub const fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Keep the key at least this long after acquisition, even when the work ends earlier
    /// (run-once-per-period jobs). A failed or dropped body releases at once.
    #[must_use]
    pub const fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Stop renewing this long after acquisition, so a hung holder cannot keep the lock forever.
    #[must_use]
    pub const fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Take a fencing token: a number that strictly increases per key across holders, also
    /// after its counter expired, was lost or was rolled back by a failover, provided the clock
    /// of the Redis server that hands out the next token is not behind the one that handed out
    /// the earlier ones by more than the time since. The crate docs' "Fencing" section states
    /// where the counter lives and the exact promise. Refused on Redlock, where no counter is
    /// monotonic.
    #[must_use]
    pub const fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Makes the key a semaphore: up to `permits` holders at once, each with a lease of its own
    /// (renewed by the keeper, released by its guard; a crashed holder's permit comes back
    /// within its ttl). Every caller of one key must name the same number: a different one is
    /// [`LockError::InvalidOptions`], never a silent mix. Not with `fencing` (permits are held
    /// side by side, so a token would order nothing), and `permits(0)` is refused.
    ///
    /// Permit waiters are woken by releases and retry; they do not queue, so they are not
    /// served first come, first served. On Redlock a permit must be held on more than a
    /// majority (see [`guide::how_it_works`](crate::guide::how_it_works)): 2 or more permits
    /// over 3 nodes need every node, so one node down stops new permits and a node that
    /// restarts empty loses every permit holder. An exclusive lock on the same key waits until
    /// every permit is returned, and permit takers wait behind it once it queues.
    #[must_use]
    pub const fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Takes the key as a reader (`Mode::Read`) or a writer (`Mode::Write`, the default: every
    /// plain lock is a write lock). Readers hold side by side, each with a lease of its own;
    /// a writer holds alone. A writer that waits stops new readers from entering, so a stream of
    /// readers cannot starve it (a stream of writers can keep readers waiting); not on Redlock
    /// or with `confirm_replicas`, where writers do not queue. While a writer waits, a read
    /// body that waits for *another task* reading the same key waits for that writer, which
    /// waits for the body: do not hand reads of one key from task to task. Not with
    /// `permits`, nor with `fencing` on a read (readers side by side have no order).
    ///
    /// A task that holds a read lock cannot take the write lock of the same key inside it
    /// ([`LockError::InvalidOptions`]): it would wait for its own read lock, and two such
    /// upgraders would wait for each other forever. A writer may take the read lock inside: it
    /// re-enters its write lock.
    #[must_use]
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Names the family of keys this lock belongs to, e.g. `"deploy:<id>"`: metrics (the
    /// `metrics` feature) are labeled with it, never with the rendered key, whose values are
    /// unbounded. `#[distributed_lock]` sets it to its key template (a multi-key lock's
    /// templates joined by ` + `); a lock without one is labeled `untemplated`.
    #[must_use]
    pub const fn template(mut self, template: &'static str) -> Self {
        self.template = Some(template);
        self
    }

    /// Which side of a read-write lock the request takes.
    #[must_use]
    pub const fn get_mode(&self) -> Mode {
        self.mode
    }

    /// How the key is held: alone, as a reader, or as one of `permits`.
    pub(crate) fn share(&self) -> Share {
        match (self.mode, self.permits) {
            (Mode::Read, _) => Share::Read,
            (Mode::Write, Some(n)) => Share::Permits(n),
            (Mode::Write, None) => Share::Exclusive,
        }
    }

    /// The permits of a semaphore, `None` for an exclusive lock.
    #[must_use]
    pub const fn get_permits(&self) -> Option<u32> {
        self.permits
    }

    /// The lease length.
    #[must_use]
    pub const fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The waiting budget.
    #[must_use]
    pub const fn get_wait(&self) -> Duration {
        self.wait
    }

    /// What happens on loss.
    #[must_use]
    pub const fn get_on_lost(&self) -> OnLost {
        self.on_lost
    }

    /// The same checks the attribute makes at compile time, for the manual API.
    pub(crate) fn validate(&self, key: &str) -> Result<(), LockError> {
        let bad = |reason: String| {
            Err(LockError::InvalidOptions {
                key: key.to_owned(),
                reason,
            })
        };
        if self.ttl < MIN_TTL {
            return bad(format!(
                "`ttl` of {:?} is below the minimum of {} ms: a lease's local deadline is its ttl \
                 minus a clock-drift margin (ttl/100 + 2 ms), so a shorter lease would be lost \
                 at birth or before its first renewal; use a `ttl` of 10 ms or more",
                self.ttl,
                MIN_TTL.as_millis()
            ));
        }
        if self.ttl > MAX_TTL {
            return bad(format!(
                "`ttl` of {:?} is beyond the supported {} days",
                self.ttl,
                MAX_TTL.as_secs() / 86_400
            ));
        }
        match self.permits {
            Some(0) => {
                return bad(
                    "`permits` must be at least 1: a semaphore with no permits could \
                            never be taken"
                        .into(),
                )
            }
            Some(_) if self.fencing => {
                return bad(
                    "`fencing` does not go with `permits`: permits are held side by \
                            side, so a fencing token would order nothing; drop one of them"
                        .into(),
                )
            }
            _ => {}
        }
        if self.mode == Mode::Read {
            if self.permits.is_some() {
                return bad(
                    "`mode(Mode::Read)` does not go with `permits`: a semaphore has no \
                            readers and writers, only permits; drop one of them"
                        .into(),
                );
            }
            if self.fencing {
                return bad(
                    "`fencing` does not go with `mode(Mode::Read)`: readers hold side by \
                            side, so a fencing token would order nothing; fence the writes"
                        .into(),
                );
            }
        }
        if let Some(max) = self.max_hold {
            if max > MAX_TTL {
                return bad("`max_hold` must be at most 365 days".into());
            }
            if max < self.ttl {
                return bad(format!(
                    "`max_hold` ({max:?}) is shorter than `ttl` ({:?}); renewal would never run, \
                     so lower `ttl` or drop `max_hold`",
                    self.ttl
                ));
            }
        }
        if let Some(min) = self.min_hold {
            if min.is_zero() || min > MAX_TTL {
                return bad("`min_hold` must be between 1 ms and 365 days".into());
            }
            if !self.renew && min > self.ttl {
                return bad(format!(
                    "`min_hold` ({min:?}) is longer than `ttl` ({:?}) with renewal off, so the \
                     lock would expire first; raise `ttl` or turn renewal on",
                    self.ttl
                ));
            }
            if let Some(max) = self.max_hold {
                if min > max {
                    return bad(format!(
                        "`min_hold` ({min:?}) is longer than `max_hold` ({max:?})"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The safety margin subtracted from this lock's local deadlines (see [`drift`]).
    pub(crate) fn drift(&self) -> Duration {
        drift(self.ttl)
    }

    /// The local deadline of a lease confirmed by a command sent at `sent_at`: the server
    /// started the key's expiry after that, so the key cannot expire before this.
    pub(crate) fn deadline(&self, sent_at: tokio::time::Instant) -> tokio::time::Instant {
        sent_at + self.ttl - self.drift()
    }
}

/// The safety margin subtracted from every local deadline of a lease of `ttl`: the clock-drift
/// allowance of the Redlock analysis, 1 % of the ttl plus 2 ms. The one place it is computed.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How a key is held: by one owner, or side by side (see `ACQUIRE_LUA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    /// The lock itself (also a read-write lock's write side).
    Exclusive,
    /// One of any number of readers.
    Read,
    /// One of this many permits.
    Permits(u32),
}

impl Share {
    /// As the acquire script takes it (`ARGV[6]`).
    pub(crate) fn wire(self) -> String {
        match self {
            Self::Exclusive => "0".to_owned(),
            Self::Read => "read".to_owned(),
            Self::Permits(n) => n.to_string(),
        }
    }

    /// The member that records what a shared key is: `#read`, or `#permits=N`.
    pub(crate) fn tag(self) -> String {
        match self {
            Self::Exclusive => String::new(),
            Self::Read => "#read".to_owned(),
            Self::Permits(n) => format!("#permits={n}"),
        }
    }

    /// The kind a shared key's tag names.
    pub(crate) fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "#read" => Some(Self::Read),
            _ => tag
                .strip_prefix("#permits=")?
                .parse()
                .ok()
                .map(Self::Permits),
        }
    }

    pub(crate) fn is_shared(self) -> bool {
        self != Self::Exclusive
    }

    /// For errors: what a caller asked for, or what a key is.
    pub(crate) fn describe(self) -> String {
        match self {
            Self::Exclusive => "an exclusive (write) lock".to_owned(),
            Self::Read => "a read lock".to_owned(),
            Self::Permits(n) => format!("a semaphore of {n} permits"),
        }
    }

    /// Why a key held as `found` by others cannot be taken as `self`: shared keys of
    /// different kinds or sizes never mix (an exclusive lock simply waits for them).
    pub(crate) fn mismatch(self, key: &str, node: &str, found: Self) -> LockError {
        LockError::InvalidOptions {
            key: key.to_owned(),
            reason: format!(
                "it is {} on {node}, and this call asks for {}; every caller of one key must \
                 take it the same way (the same `permits`; `mode = \"read\"` only on a \
                 read-write lock)",
                found.describe(),
                self.describe()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The reason `options` are refused for, naming the key; `None` when they are taken.
    fn refused(options: LockOptions) -> Option<String> {
        match options.validate("the-key") {
            Ok(()) => None,
            Err(LockError::InvalidOptions { key, reason }) => {
                assert_eq!(key, "the-key");
                Some(reason)
            }
            Err(other) => panic!("not InvalidOptions: {other:?}"),
        }
    }

    #[test]
    fn a_ttl_is_taken_from_10_ms_to_365_days() {
        let at = |ttl| refused(LockOptions::new().ttl(ttl));
        assert_eq!(at(MIN_TTL), None);
        assert!(at(MIN_TTL - MS).is_some_and(|r| r.contains("10 ms or more")));
        assert_eq!(at(MAX_TTL), None);
        assert!(at(MAX_TTL + MS).is_some_and(|r| r.contains("365 days")));
    }

    #[test]
    fn holds_are_bounded_by_the_ttl_and_each_other() {
        let ttl = Duration::from_secs(1);
        let base = LockOptions::new().ttl(ttl);
        assert_eq!(refused(base.max_hold(ttl)), None);
        assert!(refused(base.max_hold(ttl - MS)).is_some_and(|r| r.contains("shorter than `ttl`")));
        assert!(refused(base.max_hold(MAX_TTL + MS)).is_some());
        assert!(refused(base.min_hold(Duration::ZERO)).is_some());
        assert_eq!(refused(base.min_hold(MS)), None);
        // With renewal off, a hold longer than the ttl would outlive the key.
        assert_eq!(refused(base.min_hold(ttl * 2)), None);
        assert!(refused(base.renew(false).min_hold(ttl * 2)).is_some_and(|r| r.contains("expire")));
        assert_eq!(refused(base.renew(false).min_hold(ttl)), None);
        let both = base.max_hold(ttl * 2);
        assert_eq!(refused(both.min_hold(ttl * 2)), None);
        assert!(refused(both.min_hold(ttl * 2 + MS)).is_some_and(|r| r.contains("max_hold")));
    }

    #[test]
    fn shared_locks_refuse_what_orders_or_divides_nothing() {
        let base = LockOptions::new();
        assert!(refused(base.permits(0)).is_some());
        assert_eq!(refused(base.permits(1)), None);
        assert!(refused(base.permits(2).fencing(true)).is_some_and(|r| r.contains("fencing")));
        assert!(refused(base.mode(Mode::Read).permits(2)).is_some());
        assert!(refused(base.mode(Mode::Read).fencing(true)).is_some());
        assert_eq!(refused(base.mode(Mode::Read)), None);
        assert_eq!(refused(base.mode(Mode::Write).fencing(true)), None);
    }

    #[test]
    fn the_drift_allowance_is_one_percent_of_the_ttl_plus_2_ms() {
        assert_eq!(drift(Duration::from_secs(1)), Duration::from_millis(12));
        assert_eq!(drift(MIN_TTL), Duration::from_micros(2_100));
        assert_eq!(LockOptions::new().drift(), drift(Duration::from_secs(30)));
    }

    #[test]
    fn a_share_is_written_and_tagged_as_the_scripts_read_it() {
        assert_eq!(Share::Exclusive.wire(), "0");
        assert_eq!(Share::Read.wire(), "read");
        assert_eq!(Share::Permits(3).wire(), "3");
        for share in [Share::Read, Share::Permits(1), Share::Permits(250)] {
            assert_eq!(Share::from_tag(&share.tag()), Some(share));
        }
        assert_eq!(Share::Exclusive.tag(), "");
        for foreign in ["", "#write", "#permits=", "#permits=x", "read", "#read "] {
            assert_eq!(Share::from_tag(foreign), None, "{foreign:?}");
        }
    }
}
