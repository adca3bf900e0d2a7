//! Waiting for a busy lock by notification instead of polling: who waits for which key, and
//! how a release notification reaches one of them. Where notifications come from is not this
//! module's business: the in-memory store calls [`WaitHub::notify`] itself, and a Redis
//! deployment runs one feed per node (its pub/sub subscriber) that follows the channels this
//! hub's waiters wait on ([`Waiters::channels`]), told whenever that set changes.
//!
//! A channel is followed while at least one local task waits for that key, and given up when
//! the last one leaves. A notification wakes one local waiter per release (tokio's
//! `notify_one`, whose permit passes on if that waiter was cancelled), so a release costs one
//! retry per process rather than one per waiting task. A notification that names its tenure
//! (see [`tenure_name`]) wakes nobody the second time it arrives: a Redlock release is
//! published by every node that held the lock, and still costs one retry per process.
//!
//! This hub knows no engine: a feed reads its store's messages into a [`Notice`] (the Redis
//! one in `backend::redis::notification`) and the in-memory store makes them itself.
//!
//! Where the store hands a released lock straight to the oldest waiter (see `RELEASE_LUA`), the
//! notice names the new holder's tenure, its fencing token and the attempt whose queue
//! place it went to ([`Grant`]): it wakes that waiter alone, which holds the lock on arrival
//! unless an attempt of its own has since found the lock taken, and nobody else (the lock is
//! not free).
//!
//! Observers of a key (an election's, see `election`) are woken by every notification on its
//! channel, and by the news that a lock was taken ([`Notice::Taken`], which wakes no waiter): whoever
//! holds it may have changed.
//!
//! A waiter registers its interest *before* its next attempt, so a release between a failed
//! attempt and the subscription is never missed. Every wait is also bounded by the holder's
//! remaining lease, so a lost message (a reconnect, a crashed holder that never released)
//! costs at most one lease.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The waiting side of a registry (or of an in-memory store).
pub(crate) struct WaitHub {
    shared: Arc<Slots>,
    /// One per node (several for Redlock); none for the in-memory store.
    feeds: Vec<Feed>,
    /// How long a new waiter waits for a feed to follow its channel.
    follow_within: Duration,
}

struct Slots {
    by_channel: Mutex<HashMap<String, SlotEntry>>,
    /// How many feeds must announce a tenure's release before it wakes a waiter: a majority of
    /// Redlock's nodes, whose releases reach them one by one (woken by the first, a waiter
    /// would race the release still on its way to the others, and lose); one elsewhere.
    wake_after: usize,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            by_channel: Mutex::default(),
            wake_after: 1,
        }
    }
}

struct SlotEntry {
    slot: Arc<Slot>,
    interest: usize,
}

struct Slot {
    notify: Notify,
    /// Every notification on the channel, for observers: they look again.
    news: Notify,
    /// Whether a feed confirmed following the channel (set by the feed, never cleared while
    /// the slot lives), and the signal that it did.
    followed: AtomicBool,
    now_followed: Notify,
    /// The tenures whose release was announced here, newest last, with how many feeds have
    /// announced it: one release arrives once per node that held it, within moments of each
    /// other.
    released: Mutex<VecDeque<(String, usize)>>,
    /// The waiters here that a release may hand the lock to, by the name of their tenure.
    handoffs: Mutex<HashMap<String, Arc<Handoff>>>,
}

/// A handed-over lock on its way to the waiter it went to.
#[derive(Default)]
struct Handoff {
    /// The newest grant that arrived and was not yet taken by the waiter.
    grant: Mutex<Option<Grant>>,
    arrived: Notify,
}

/// What a release that handed the lock to a waiter tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The new holder's fencing token (0 without fencing).
    pub fence: u64,
    /// Which of the waiter's attempts took the queue place the lock went to (see
    /// `Acquire::attempt`): the key expires with that place, one ttl after that attempt ran.
    /// `None` from a releaser that does not say.
    pub place: Option<u32>,
}

/// What a store tells the waiters of a key, read from its own message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Notice<'a> {
    /// The lock is free; with the released tenure where the message names it.
    Freed { released: Option<&'a str> },
    /// The lock went to the waiter whose tenure is `next`.
    HandedOver { next: &'a str, grant: Grant },
    /// The lock was taken (an elected candidate's announcement): news for observers, nothing
    /// for waiters.
    Taken,
}

/// How many released tenures a slot remembers; far more than releases of one key that can
/// be in flight between its nodes at once.
const REMEMBERED: usize = 8;

impl Slot {
    fn released(&self) -> MutexGuard<'_, VecDeque<(String, usize)>> {
        self.released.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handoffs(&self) -> MutexGuard<'_, HashMap<String, Arc<Handoff>>> {
        self.handoffs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deliver(&self, notice: &Notice<'_>, wake_after: usize) {
        self.news.notify_waiters();
        match *notice {
            Notice::Taken => {}
            Notice::Freed { released } => self.wake_one(released, wake_after),
            Notice::HandedOver { next, grant } => {
                if let Some(handoff) = self.handoffs().get(next) {
                    *handoff.grant.lock().unwrap_or_else(PoisonError::into_inner) = Some(grant);
                    handoff.arrived.notify_one();
                }
            }
        }
    }

    /// Wakes one waiter once `wake_after` feeds announced the release of this notification's
    /// tenure, and never again for it; a notification that names no tenure wakes one at once.
    fn wake_one(&self, tenure: Option<&str>, wake_after: usize) {
        if let Some(tenure) = tenure {
            let mut released = self.released();
            let announced = match released.iter_mut().find(|(seen, _)| seen == tenure) {
                Some((_, count)) => {
                    *count += 1;
                    *count
                }
                None => {
                    if released.len() == REMEMBERED {
                        released.pop_front();
                    }
                    released.push_back((tenure.to_owned(), 1));
                    1
                }
            };
            if announced != wake_after {
                return;
            }
        }
        self.notify.notify_one();
    }
}

/// How a release notification names the tenure it ended: the SHA-1 (lowercase hex) of the
/// holder's token, as `RELEASE_LUA` publishes it. The token itself is a credential, so it never
/// goes out on a channel.
pub(crate) fn tenure_name(token: &str) -> String {
    sha1_smol::Sha1::from(token).digest().to_string()
}

impl Slots {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, SlotEntry>> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single insert, remove or counter change), so a poisoned lock is still usable.
        self.by_channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn deliver(&self, channel: &str, notice: &Notice<'_>) {
        let slot = self.lock().get(channel).map(|entry| entry.slot.clone());
        if let Some(slot) = slot {
            slot.deliver(notice, self.wake_after);
        }
    }

    fn wake_every_key(&self) {
        for entry in self.lock().values() {
            entry.slot.notify.notify_one();
            entry.slot.news.notify_waiters();
        }
    }
}

/// A feed's hold on the waiters it serves; it does not keep them alive.
#[derive(Clone)]
pub(crate) struct Waiters {
    slots: Weak<Slots>,
    /// Poked whenever the set of channels someone waits on changed.
    changed: Arc<Notify>,
}

impl Waiters {
    /// Delivers `notice` for `channel`'s key: to the waiter the lock was handed to, or to one
    /// waiter of a freed lock, and to its observers. `false` once the hub is gone: the feed may
    /// stop.
    pub(crate) fn deliver(&self, channel: &str, notice: &Notice<'_>) -> bool {
        self.slots
            .upgrade()
            .map(|s| s.deliver(channel, notice))
            .is_some()
    }

    /// Wakes one waiter of every channel, for notifications that may have been missed.
    pub(crate) fn wake_every_key(&self) -> bool {
        self.slots.upgrade().map(|s| s.wake_every_key()).is_some()
    }

    /// The channels someone waits on now; `None` once the hub is gone.
    pub(crate) fn channels(&self) -> Option<Vec<String>> {
        self.slots
            .upgrade()
            .map(|s| s.lock().keys().cloned().collect())
    }

    /// Resolves when the channels someone waits on may have changed since the last call.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The feed follows no channel any more (its connection is gone): their waiters back off
    /// until it follows them again. For a hub of one feed. `false` once the hub is gone.
    #[cfg(feature = "postgres")]
    pub(crate) fn unfollowed(&self) -> bool {
        self.slots
            .upgrade()
            .map(|s| {
                for entry in s.lock().values() {
                    entry.slot.followed.store(false, Ordering::Release);
                }
            })
            .is_some()
    }

    /// The feed follows `channel` now: its waiters may rely on notifications.
    pub(crate) fn followed(&self, channel: &str) {
        let Some(slots) = self.slots.upgrade() else {
            return;
        };
        let slot = slots.lock().get(channel).map(|entry| entry.slot.clone());
        if let Some(slot) = slot {
            slot.followed.store(true, Ordering::Release);
            slot.now_followed.notify_waiters();
        }
    }
}

/// One source of notifications: a task started on first use (on the I/O runtime), which
/// follows the channels the hub's waiters wait on. It reads that set itself whenever told it
/// changed, so nothing queues up while it cannot keep up (or is stuck reconnecting).
struct Feed {
    changed: Arc<Notify>,
    start: Mutex<Option<BoxFuture<'static, ()>>>,
}

impl Feed {
    fn ensure_started(&self) {
        let task = self
            .start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            crate::io::spawn(task);
        }
    }
}

/// A local task's interest in one key's releases. Dropping it gives the interest back.
pub(crate) struct Interest<'a> {
    hub: &'a WaitHub,
    channel: String,
    slot: Arc<Slot>,
    /// Whether notifications come from the store itself (the in-memory backend).
    local: bool,
    /// The tenure this waiter may be handed the lock for, once it said so.
    handoff: Option<(String, Arc<Handoff>)>,
}

impl Interest<'_> {
    /// Whether a release notification can arrive: the store sends them itself, or a feed
    /// follows the channel. Without, the waiter backs off; a feed that recovers later makes it
    /// `true` again (and one that loses its connection may make it `false`, see
    /// [`Waiters::unfollowed`]).
    pub(crate) fn notified_by_server(&self) -> bool {
        self.local || self.slot.followed.load(Ordering::Acquire)
    }

    /// Resolves on the next release notification for this key that leaves it free.
    pub(crate) async fn released(&self) {
        self.slot.notify.notified().await;
    }

    /// Resolves on the next notification of any kind for this key (a release, a handoff, a
    /// new holder's announcement) after this call: enable it before looking at the key, so that
    /// a change in between still wakes it.
    pub(crate) fn news(&self) -> tokio::sync::futures::Notified<'_> {
        self.slot.news.notified()
    }

    /// From now on, a release that hands the lock to `token` is delivered to
    /// [`handed_over`](Self::handed_over) (instead of one to the token expected before).
    pub(crate) fn expect_handoff(&mut self, token: &str) {
        if let Some((tenure, _)) = self.handoff.take() {
            self.slot.handoffs().remove(&tenure);
        }
        let (tenure, handoff) = (tenure_name(token), Arc::<Handoff>::default());
        self.slot.handoffs().insert(tenure.clone(), handoff.clone());
        self.handoff = Some((tenure, handoff));
    }

    /// Resolves when a release handed the lock to this waiter's token (see
    /// [`expect_handoff`](Self::expect_handoff); never without it), with what came with it. The
    /// grant is taken: a stale one (an attempt since found the lock taken) is not seen again.
    pub(crate) async fn handed_over(&self) -> Grant {
        let Some((_, handoff)) = &self.handoff else {
            return std::future::pending().await;
        };
        loop {
            let arrived = handoff.arrived.notified();
            let taken = handoff
                .grant
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(grant) = taken {
                return grant;
            }
            arrived.await;
        }
    }
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        if let Some((tenure, _)) = &self.handoff {
            self.slot.handoffs().remove(tenure);
        }
        let mut slots = self.hub.shared.lock();
        let Some(entry) = slots.get_mut(&self.channel) else {
            return;
        };
        entry.interest -= 1;
        if entry.interest == 0 {
            slots.remove(&self.channel);
            drop(slots);
            for feed in &self.hub.feeds {
                feed.changed.notify_one();
            }
        }
    }
}

impl WaitHub {
    /// Notifications come from the store itself (the in-memory backend).
    pub(crate) fn local() -> Self {
        Self {
            shared: Arc::default(),
            feeds: Vec::new(),
            follow_within: Duration::ZERO,
        }
    }

    /// Notifications come from these feeds, all waking the same waiters (a release announced
    /// by a majority of Redlock's nodes wakes them). Each is built from its hold on the waiters, and started on
    /// first use. A waiter relies on them once one follows its channel, and waits for that at
    /// most `follow_within` before it backs off instead.
    pub(crate) fn fed_by<I, M, F>(feeds: I, follow_within: Duration) -> Self
    where
        I: IntoIterator<Item = M>,
        M: FnOnce(Waiters) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let feeds: Vec<M> = feeds.into_iter().collect();
        let shared = Arc::new(Slots {
            wake_after: feeds.len() / 2 + 1,
            ..Slots::default()
        });
        let feeds = feeds
            .into_iter()
            .map(|make| {
                let changed = Arc::new(Notify::new());
                let task = make(Waiters {
                    slots: Arc::downgrade(&shared),
                    changed: changed.clone(),
                });
                Feed {
                    changed,
                    start: Mutex::new(Some(Box::pin(task))),
                }
            })
            .collect();
        Self {
            shared,
            feeds,
            follow_within,
        }
    }

    /// Wakes one waiter for `channel` (the in-memory backend calls this on release).
    pub(crate) fn notify(&self, channel: &str) {
        self.shared
            .deliver(channel, &Notice::Freed { released: None });
    }

    /// Tells the key's observers that the lock was taken (the in-memory backend's
    /// [`Notice::Taken`]).
    pub(crate) fn taken(&self, channel: &str) {
        self.shared.deliver(channel, &Notice::Taken);
    }

    /// Tells the waiter holding `token` that a release handed it the lock (the in-memory
    /// backend's handoff).
    pub(crate) fn hand_over(&self, channel: &str, token: &str, grant: Grant) {
        let next = tenure_name(token);
        self.shared
            .deliver(channel, &Notice::HandedOver { next: &next, grant });
    }

    /// Whether a release notification for the tenure of `token` on `channel` has arrived
    /// while someone here waited for it: the holder is letting go, though some of its nodes
    /// may not have deleted the lock yet.
    pub(crate) fn released_recently(&self, channel: &str, token: &str) -> bool {
        let slot = self.shared.lock().get(channel).map(|e| e.slot.clone());
        slot.is_some_and(|slot| {
            let tenure = tenure_name(token);
            slot.released().iter().any(|(seen, _)| *seen == tenure)
        })
    }

    /// How many waiters here are interested in `channel` now.
    pub(crate) fn interested(&self, channel: &str) -> usize {
        self.shared.lock().get(channel).map_or(0, |e| e.interest)
    }

    /// Registers interest in `channel` and returns once notifications for it can arrive, or
    /// at `give_up_at` (the caller's `wait`), or after the hub's `follow_within`, whichever
    /// comes first: a feed that cannot follow (stuck reconnecting) costs a waiter that long
    /// before it tries again, never its whole wait.
    ///
    /// The interest is counted by the returned guard from the start, so a caller cancelled while
    /// subscribing gives it back. One feed's confirmation is enough (any node's release wakes
    /// the waiters): a silent node never holds up the others.
    pub(crate) async fn interest(&self, channel: &str, give_up_at: Instant) -> Interest<'_> {
        let (slot, first) = {
            let mut slots = self.shared.lock();
            let entry = slots
                .entry(channel.to_owned())
                .or_insert_with(|| SlotEntry {
                    slot: Arc::new(Slot {
                        notify: Notify::new(),
                        news: Notify::new(),
                        followed: AtomicBool::new(false),
                        now_followed: Notify::new(),
                        released: Mutex::default(),
                        handoffs: Mutex::default(),
                    }),
                    interest: 0,
                });
            entry.interest += 1;
            (entry.slot.clone(), entry.interest == 1)
        };
        let interest = Interest {
            hub: self,
            channel: channel.to_owned(),
            slot: slot.clone(),
            local: self.feeds.is_empty(),
            handoff: None,
        };
        if first {
            for feed in &self.feeds {
                feed.ensure_started();
                feed.changed.notify_one();
            }
        }
        let until = give_up_at.min(Instant::now() + self.follow_within);
        let followed = async {
            loop {
                let now_followed = slot.now_followed.notified();
                let mut now_followed = std::pin::pin!(now_followed);
                now_followed.as_mut().enable();
                if interest.notified_by_server() {
                    return;
                }
                now_followed.await;
            }
        };
        let _ = tokio::time::timeout_at(until, followed).await;
        interest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenure_is_named_as_redis_sha1hex_names_it() {
        // `redis.sha1hex('abc')`, the FIPS 180 test vector.
        assert_eq!(
            tenure_name("abc"),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    /// A hub of `nodes` feeds that deliver nothing themselves, and the hold on its waiters a
    /// feed would have.
    fn hub_fed_by(nodes: usize) -> (WaitHub, Waiters) {
        let feeds = (0..nodes).map(|_| |_: Waiters| std::future::ready(()));
        let hub = WaitHub::fed_by(feeds, Duration::ZERO);
        let waiters = Waiters {
            slots: Arc::downgrade(&hub.shared),
            changed: Arc::default(),
        };
        (hub, waiters)
    }

    /// Redlock's nodes each announce a release as it reaches them: a waiter woken by the first
    /// would race the release still on its way to the others, and lose.
    #[tokio::test]
    async fn a_tenure_announced_by_several_nodes_wakes_one_waiter_once_a_majority_did() {
        let (hub, waiters) = hub_fed_by(3);
        let far = Instant::now() + Duration::from_secs(60);
        let (first, second) = (hub.interest("k", far).await, hub.interest("k", far).await);
        let tenure = tenure_name("holder-token");
        assert!(!hub.released_recently("k", "holder-token"));
        let woken = |interest: &Interest<'_>| {
            let notified = interest.slot.notify.notified();
            futures_util::FutureExt::now_or_never(notified).is_some()
        };
        let freed = Notice::Freed {
            released: Some(&tenure),
        };
        assert!(waiters.deliver("k", &freed));
        assert!(hub.released_recently("k", "holder-token"));
        assert!(!woken(&first), "one node of three announced it");
        assert!(waiters.deliver("k", &freed));
        assert!(woken(&first), "a majority announced it: one waiter wakes");
        assert!(waiters.deliver("k", &freed));
        assert!(!woken(&second), "the last copy wakes nobody");
        // Notices that name no tenure wake a waiter each time.
        waiters.deliver("k", &Notice::Freed { released: None });
        assert!(woken(&second));
    }

    #[tokio::test]
    async fn a_handed_over_lock_reaches_its_waiter_alone() {
        let (hub, waiters) = hub_fed_by(1);
        let far = Instant::now() + Duration::from_secs(60);
        let (mut chosen, mut other) = (hub.interest("k", far).await, hub.interest("k", far).await);
        chosen.expect_handoff("chosen-token");
        other.expect_handoff("other-token");
        let grant = Grant {
            fence: 42,
            place: Some(7),
        };
        let next = tenure_name("chosen-token");
        waiters.deliver("k", &Notice::HandedOver { next: &next, grant });
        use futures_util::FutureExt;
        assert_eq!(chosen.handed_over().now_or_never(), Some(grant));
        assert_eq!(
            chosen.handed_over().now_or_never(),
            None,
            "a grant is taken once"
        );
        assert_eq!(
            other.handed_over().now_or_never(),
            None,
            "not handed to the other"
        );
        assert!(
            other.released().now_or_never().is_none(),
            "nor woken: the lock is not free"
        );
        // An older releaser names no place.
        let grant = Grant {
            fence: 0,
            place: None,
        };
        let next = tenure_name("other-token");
        waiters.deliver("k", &Notice::HandedOver { next: &next, grant });
        assert_eq!(other.handed_over().now_or_never(), Some(grant));
    }
}
