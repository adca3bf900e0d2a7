//! Waiting for a busy lock by notification instead of polling.
//!
//! Every release publishes on the lock's channel. A registry keeps one subscriber connection
//! (per node) that all its waiters share; a channel is subscribed while at least one local task
//! waits for that key and unsubscribed when the last one leaves. A notification wakes one local
//! waiter per release (tokio's `notify_one`, whose permit passes on if that waiter was cancelled),
//! so a release costs one retry per process rather than one per waiting task.
//!
//! A waiter subscribes *before* its next attempt, so a release between a failed attempt and the
//! subscription is never missed. Every wait is also bounded by the holder's remaining lease, so a
//! lost message (a reconnect, a crashed holder that never released) costs at most one lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, PushInfo, PushKind};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

/// The waiting side of a registry (or of an in-memory store).
pub(crate) struct WaitHub {
    shared: Arc<Slots>,
    /// One per node (several for Redlock); none for the in-memory store.
    subscribers: Vec<Subscriber>,
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
    /// Whether the channel's subscription was confirmed; set once by the first waiter.
    subscribed: tokio::sync::OnceCell<bool>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SlotEntry>> {
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

/// A local task's interest in one key's releases. Dropping it gives the interest back.
pub(crate) struct Interest<'a> {
    hub: &'a WaitHub,
    channel: String,
    slot: Arc<Slot>,
    /// `false` when no notification can arrive (the subscription failed): the waiter backs off.
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
            // Sent under the map lock, so an UNSUBSCRIBE can never overtake the SUBSCRIBE of a
            // waiter that arrives right after: the subscriber task handles both in this order.
            for sub in &self.hub.subscribers {
                let _ = sub
                    .commands
                    .send(Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

impl WaitHub {
    /// Notifications come from the store itself (the in-memory backend).
    pub(crate) fn local() -> Self {
        Self {
            shared: Arc::default(),
            subscribers: Vec::new(),
        }
    }

    /// Notifications come from Redis pub/sub: one RESP3 connection per source, all feeding the
    /// same waiters (a release on any Redlock node wakes them).
    pub(crate) fn redis(sources: Vec<Source>, timeouts: crate::Timeouts) -> Self {
        let shared = Arc::<Slots>::default();
        let subscribers = sources
            .into_iter()
            .map(|source| {
                let (commands, receiver) = mpsc::unbounded_channel();
                Subscriber {
                    commands,
                    start: Mutex::new(Some(SubscriberTask {
                        source,
                        reconnect: Arc::new(Notify::new()),
                        timeouts,
                        slots: Arc::downgrade(&shared),
                        commands: receiver,
                    })),
                }
            })
            .collect();
        Self {
            shared,
            subscribers,
        }
    }

    /// Wakes one waiter for `channel` (the in-memory backend calls this on release).
    pub(crate) fn notify(&self, channel: &str) {
        self.shared.wake_one(channel);
    }

    /// Registers interest in `channel` and returns once notifications for it can arrive, or
    /// at `give_up_at` (the caller's `wait`), whichever comes first.
    ///
    /// The interest is counted by the returned guard from the start, so a caller cancelled while
    /// subscribing gives it back. One node's confirmation is enough (any node's release wakes
    /// the waiters): a silent node never holds up the others.
    pub(crate) async fn interest(&self, channel: &str, give_up_at: Instant) -> Interest<'_> {
        let (slot, first) = {
            let mut slots = self.shared.lock();
            let entry = slots
                .entry(channel.to_owned())
                .or_insert_with(|| SlotEntry {
                    slot: Arc::new(Slot {
                        notify: Notify::new(),
                        subscribed: tokio::sync::OnceCell::new(),
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
        if self.subscribers.is_empty() {
            return interest;
        }
        let subscribed = slot.subscribed.get_or_init(|| async {
            let mut confirmations = FuturesUnordered::new();
            for sub in &self.subscribers {
                if first {
                    sub.ensure_started();
                }
                let (reply, confirmed) = oneshot::channel();
                // Sent again by the next waiter if this one is cancelled before a confirmation
                // (subscribing twice is harmless); a slot's unsubscribe is only sent after the
                // slot left the map.
                let _ = sub
                    .commands
                    .send(Command::Subscribe(channel.to_owned(), reply));
                confirmations.push(confirmed);
            }
            while let Some(confirmed) = confirmations.next().await {
                if confirmed.unwrap_or(false) {
                    return true;
                }
            }
            false
        });
        interest.notified_by_server = tokio::time::timeout_at(give_up_at, subscribed)
            .await
            .is_ok_and(|subscribed| *subscribed);
        interest
    }
}

struct Subscriber {
    commands: mpsc::UnboundedSender<Command>,
    /// The task is spawned on first use, from inside the runtime that waits.
    start: Mutex<Option<SubscriberTask>>,
}

impl Subscriber {
    fn ensure_started(&self) {
        let task = self
            .start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            crate::io::spawn(task.run());
        }
    }
}

/// Where a subscriber connects: a standalone server (plain channels) or a cluster (sharded
/// channels, so a release notification travels only to the shard that owns the lock).
#[derive(Clone)]
pub(crate) enum Source {
    Server(Box<redis::Client>),
    Cluster(crate::backend::redis::ClusterSeeds),
    /// Whichever master the sentinels name when the subscriber (re)connects.
    Sentinel(Arc<crate::backend::sentinel::SentinelSetup>),
}

enum Connection {
    Server(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Connection {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Server(c) => c.subscribe(channel).await,
            Self::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    /// Every channel in one command on a server; one at a time on a cluster, where a sharded
    /// subscription names one slot.
    async fn subscribe_all(&mut self, channels: &[String]) -> redis::RedisResult<()> {
        match self {
            Self::Server(c) => c.subscribe(channels).await,
            Self::Cluster(c) => {
                for channel in channels {
                    c.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    async fn ping(&mut self) -> redis::RedisResult<()> {
        match self {
            Self::Server(c) => redis::cmd("PING").query_async(c).await,
            Self::Cluster(c) => redis::cmd("PING").query_async(c).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Server(c) => c.unsubscribe(channel).await,
            Self::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

enum Command {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

struct SubscriberTask {
    source: Source,
    /// Poked on a disconnection: the connection only reconnects (and resubscribes) when a
    /// command is sent on it, and a subscriber sends none of its own.
    reconnect: Arc<Notify>,
    timeouts: crate::Timeouts,
    slots: Weak<Slots>,
    commands: mpsc::UnboundedReceiver<Command>,
}

impl SubscriberTask {
    async fn run(mut self) {
        let mut connection: Option<Connection> = None;
        let mut warned = false;
        loop {
            let command = tokio::select! {
                command = self.commands.recv() => match command {
                    Some(command) => command,
                    None => return,
                },
                () = self.reconnect.notified() => {
                    if let Some(con) = &mut connection {
                        self.reestablish(con).await;
                    }
                    continue;
                }
            };
            match command {
                Command::Subscribe(channel, reply) => {
                    if connection.is_none() {
                        connection = self.connect(&mut warned).await;
                    }
                    let ok = match &mut connection {
                        Some(con) => self.timed(con.subscribe(&channel)).await,
                        None => false,
                    };
                    let _ = reply.send(ok);
                }
                Command::Unsubscribe(channel) => {
                    if let Some(con) = &mut connection {
                        let _ = self.timed(con.unsubscribe(&channel)).await;
                    }
                }
            }
        }
    }

    /// Pings until the connection is back, then subscribes again to every channel a local task
    /// waits on, backing off up to a second; then every waiting key retries once, for releases
    /// missed meanwhile.
    async fn reestablish(&self, con: &mut Connection) {
        let mut delay = Duration::from_millis(10);
        loop {
            let Some(slots) = self.slots.upgrade() else {
                return;
            };
            let channels: Vec<String> = slots.lock().keys().cloned().collect();
            drop(slots);
            if channels.is_empty() {
                // Nobody waits; the next subscription reconnects.
                return;
            }
            // The client's automatic resubscription on reconnect was seen to miss (about one
            // reset in a hundred under load: reconnected, yet not subscribed), so the channels
            // are subscribed again here; a channel subscribed twice is confirmed, not doubled.
            // Any answer, even a refusal (an ACL without `+ping`), proves the connection is
            // back; only no answer at all is worth another try.
            if self.answered(con.ping()).await {
                if self.answered(con.subscribe_all(&channels)).await {
                    break;
                }
            } else if let Source::Sentinel(_) = self.source {
                // The master may have moved: follow the sentinels rather than keep knocking.
                if let Some(moved) = self.connect(&mut true).await {
                    *con = moved;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
        if let Some(slots) = self.slots.upgrade() {
            slots.wake_every_key();
        }
    }

    /// Wakes waiters right on the connection's reader task: a release notification reaches the
    /// waiter without passing through another task first (the handoff is latency-bound).
    fn push_sender(&self) -> impl redis::aio::AsyncPushSender {
        let slots = self.slots.clone();
        let reconnect = self.reconnect.clone();
        move |push: PushInfo| {
            let Some(slots) = slots.upgrade() else {
                return Err(redis::aio::SendError);
            };
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    if let Some(channel) = push
                        .data
                        .first()
                        .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    {
                        slots.wake_one(&channel);
                    }
                }
                // Messages may have been missed while disconnected: every waiting key retries
                // once now, and again once the subscriber has reconnected and resubscribed.
                PushKind::Disconnection => {
                    slots.wake_every_key();
                    reconnect.notify_one();
                }
                _ => {}
            }
            Ok(())
        }
    }

    /// Whether the server answered at all: a refusal is an answer (retrying would not change
    /// it; a waiter whose subscription is refused is still bounded by the holder's lease).
    async fn answered<F: std::future::Future<Output = redis::RedisResult<()>>>(
        &self,
        f: F,
    ) -> bool {
        match tokio::time::timeout(self.timeouts.command, f).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => !crate::backend::redis::unanswered(&e),
            Err(_) => false,
        }
    }

    async fn timed<F: std::future::Future<Output = redis::RedisResult<()>>>(&self, f: F) -> bool {
        matches!(
            tokio::time::timeout(self.timeouts.command, f).await,
            Ok(Ok(()))
        )
    }

    /// A RESP3 connection manager to one server that resubscribes on its own when it can.
    async fn subscriber(&self, client: redis::Client) -> redis::RedisResult<Connection> {
        let config = crate::backend::redis::manager_config(self.timeouts)
            .set_push_sender(self.push_sender())
            .set_automatic_resubscription();
        ConnectionManager::new_with_config(client, config)
            .await
            .map(Connection::Server)
    }

    async fn connect(&self, warned: &mut bool) -> Option<Connection> {
        let connect = async {
            match &self.source {
                Source::Server(client) => self.subscriber(client.as_ref().clone()).await,
                Source::Sentinel(setup) => {
                    let master = resp3(&setup.master().await?).ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::InvalidClientConfig,
                            "the master's address cannot be switched to RESP3",
                        ))
                    })?;
                    self.subscriber(master).await
                }
                Source::Cluster(seeds) => seeds
                    .builder()
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(self.push_sender())
                    .connection_timeout(self.timeouts.connect)
                    .response_timeout(self.timeouts.command)
                    .build()?
                    .get_async_connection()
                    .await
                    .map(Connection::Cluster),
            }
        };
        let attempt = tokio::time::timeout(self.timeouts.connect * 2, connect).await;
        match attempt {
            Ok(Ok(con)) => Some(con),
            failure => {
                if !*warned {
                    *warned = true;
                    let why = match failure {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    tracing::warn!(
                        node = %self.source.node(),
                        error = %why,
                        "lock waiters cannot subscribe to release notifications (RESP3 pub/sub); \
                         falling back to jittered polling"
                    );
                }
                None
            }
        }
    }
}

impl Source {
    /// A standalone server's client, switched to RESP3 (push messages need it).
    pub(crate) fn server(client: &redis::Client) -> Option<Self> {
        resp3(client).map(|c| Self::Server(Box::new(c)))
    }

    fn node(&self) -> String {
        match self {
            Self::Server(c) => c.get_connection_info().addr().to_string(),
            Self::Cluster(seeds) => seeds
                .nodes
                .iter()
                .map(|s| s.addr().to_string())
                .collect::<Vec<_>>()
                .join(","),
            Self::Sentinel(setup) => setup.node_name(),
        }
    }
}

/// The same server and login over RESP3 (push messages need it).
fn resp3(client: &redis::Client) -> Option<redis::Client> {
    let info = client.get_connection_info();
    let resp3 = info.clone().set_redis_settings(
        info.redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3),
    );
    redis::Client::open(resp3).ok()
}
