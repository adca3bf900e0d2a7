//! Waiting for a busy lock by notification instead of polling: who waits for which key, and
//! how a release notification reaches one of them. Where notifications come from is not this
//! module's business: the in-memory store calls [`WaitHub::notify`] itself, and a Redis
//! deployment runs one feed per node (its pub/sub subscriber) that this hub tells which
//! channels to follow.
//!
//! A channel is followed while at least one local task waits for that key, and given up when
//! the last one leaves. A notification wakes one local waiter per release (tokio's
//! `notify_one`, whose permit passes on if that waiter was cancelled), so a release costs one
//! retry per process rather than one per waiting task.
//!
//! A waiter registers its interest *before* its next attempt, so a release between a failed
//! attempt and the subscription is never missed. Every wait is also bounded by the holder's
//! remaining lease, so a lost message (a reconnect, a crashed holder that never released)
//! costs at most one lease.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

/// The waiting side of a registry (or of an in-memory store).
pub(crate) struct WaitHub {
    shared: Arc<Slots>,
    /// One per node (several for Redlock); none for the in-memory store.
    feeds: Vec<Feed>,
}

#[derive(Default)]
struct Slots {
    by_channel: Mutex<HashMap<String, SlotEntry>>,
}

struct SlotEntry {
    slot: Arc<Slot>,
    interest: usize,
}

struct Slot {
    notify: Notify,
    /// Whether a feed confirmed following the channel; set once by the first waiter.
    followed: tokio::sync::OnceCell<bool>,
}

impl Slots {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, SlotEntry>> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single insert, remove or counter change), so a poisoned lock is still usable.
        self.by_channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_one(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.slot.notify.notify_one();
        }
    }

    fn wake_every_key(&self) {
        for entry in self.lock().values() {
            entry.slot.notify.notify_one();
        }
    }
}

/// What a hub asks of a feed, in the order the waiters' interest changed.
pub(crate) enum FeedCommand {
    /// Start delivering this channel's notifications; answer whether the server confirmed.
    Follow(String, oneshot::Sender<bool>),
    /// Nobody here waits for this channel any more.
    Unfollow(String),
}

/// A feed's hold on the waiters it serves; it does not keep them alive.
#[derive(Clone)]
pub(crate) struct Waiters(Weak<Slots>);

impl Waiters {
    /// Wakes one waiter of `channel`. `false` once the hub is gone: the feed may stop.
    pub(crate) fn wake_one(&self, channel: &str) -> bool {
        self.0.upgrade().map(|s| s.wake_one(channel)).is_some()
    }

    /// Wakes one waiter of every channel, for notifications that may have been missed.
    pub(crate) fn wake_every_key(&self) -> bool {
        self.0.upgrade().map(|s| s.wake_every_key()).is_some()
    }

    /// The channels someone waits on now; `None` once the hub is gone.
    pub(crate) fn channels(&self) -> Option<Vec<String>> {
        self.0.upgrade().map(|s| s.lock().keys().cloned().collect())
    }
}

/// One source of notifications: a task started on first use (on the I/O runtime), and the
/// queue that tells it what to follow.
struct Feed {
    commands: mpsc::UnboundedSender<FeedCommand>,
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
    /// `false` when no notification can arrive (no feed could follow the channel): the waiter
    /// backs off.
    pub notified_by_server: bool,
}

impl Interest<'_> {
    /// Resolves on the next release notification for this key.
    pub(crate) async fn released(&self) {
        self.slot.notify.notified().await;
    }
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        let mut slots = self.hub.shared.lock();
        let Some(entry) = slots.get_mut(&self.channel) else {
            return;
        };
        entry.interest -= 1;
        if entry.interest == 0 {
            slots.remove(&self.channel);
            // Sent under the map lock, so an unfollow can never overtake the follow of a
            // waiter that arrives right after: each feed handles both in this order.
            for feed in &self.hub.feeds {
                let _ = feed
                    .commands
                    .send(FeedCommand::Unfollow(self.channel.clone()));
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
        }
    }

    /// Notifications come from these feeds, all waking the same waiters (a release on any
    /// Redlock node wakes them). Each is built from its hold on the waiters and its command
    /// queue, and started on first use.
    pub(crate) fn fed_by<I, M, F>(feeds: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: FnOnce(Waiters, mpsc::UnboundedReceiver<FeedCommand>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::<Slots>::default();
        let feeds = feeds
            .into_iter()
            .map(|make| {
                let (commands, receiver) = mpsc::unbounded_channel();
                let task = make(Waiters(Arc::downgrade(&shared)), receiver);
                Feed {
                    commands,
                    start: Mutex::new(Some(Box::pin(task))),
                }
            })
            .collect();
        Self { shared, feeds }
    }

    /// Wakes one waiter for `channel` (the in-memory backend calls this on release).
    pub(crate) fn notify(&self, channel: &str) {
        self.shared.wake_one(channel);
    }

    /// Registers interest in `channel` and returns once notifications for it can arrive, or
    /// at `give_up_at` (the caller's `wait`), whichever comes first.
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
                        followed: tokio::sync::OnceCell::new(),
                    }),
                    interest: 0,
                });
            entry.interest += 1;
            (entry.slot.clone(), entry.interest == 1)
        };
        let mut interest = Interest {
            hub: self,
            channel: channel.to_owned(),
            slot: slot.clone(),
            notified_by_server: true,
        };
        if self.feeds.is_empty() {
            return interest;
        }
        let followed = slot.followed.get_or_init(|| async {
            let mut confirmations = FuturesUnordered::new();
            for feed in &self.feeds {
                if first {
                    feed.ensure_started();
                }
                let (reply, confirmed) = oneshot::channel();
                // Sent again by the next waiter if this one is cancelled before a confirmation
                // (following twice is harmless); a slot's unfollow is only sent after the slot
                // left the map.
                let _ = feed
                    .commands
                    .send(FeedCommand::Follow(channel.to_owned(), reply));
                confirmations.push(confirmed);
            }
            while let Some(confirmed) = confirmations.next().await {
                if confirmed.unwrap_or(false) {
                    return true;
                }
            }
            false
        });
        interest.notified_by_server = tokio::time::timeout_at(give_up_at, followed)
            .await
            .is_ok_and(|followed| *followed);
        interest
    }
}
