//! The Redis feed of release notifications: one RESP3 pub/sub connection per node, following
//! the channels of the keys that local tasks wait for (sharded channels on a cluster, so a
//! notification travels only to the shard that owns the lock).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ProtocolVersion, PushInfo, PushKind};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::{node_name, ClusterSeeds};
use super::errors::unanswered;
use super::sentinel::SentinelSetup;
use crate::backoff::Backoff;
use crate::report;
use crate::timeouts::Timeouts;
use crate::waiting::{WaitHub, Waiters};

/// Where a subscriber connects.
#[derive(Clone)]
pub(crate) enum Source {
    /// A standalone server: plain channels.
    Server(Box<redis::Client>),
    /// A cluster: sharded channels.
    Cluster(ClusterSeeds),
    /// Whichever master the sentinels name when the subscriber (re)connects.
    Sentinel(Arc<SentinelSetup>),
}

/// A hub fed by one subscriber per source; waiters poll with back-off where there is none, or
/// while none follows their channel (a waiter waits for that at most one command timeout).
pub(crate) fn hub(sources: Vec<Source>, timeouts: Timeouts) -> WaitHub {
    let feeds = sources.into_iter().map(|source| {
        move |waiters| {
            Subscriber {
                source,
                reconnect: Arc::new(Notify::new()),
                timeouts,
                waiters,
            }
            .run()
        }
    });
    WaitHub::fed_by(feeds, timeouts.command)
}

enum Connection {
    Server(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Connection {
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

struct Subscriber {
    source: Source,
    /// Poked on a disconnection: the connection only reconnects (and resubscribes) when a
    /// command is sent on it, and a subscriber sends none of its own.
    reconnect: Arc<Notify>,
    timeouts: Timeouts,
    waiters: Waiters,
}

impl Subscriber {
    /// Follows the channels the waiters wait on: whenever that set changes, subscribes to the
    /// new ones (retried with back-off until it works) and leaves the ones nobody waits on any
    /// more. A channel followed is reported to its waiters, which rely on notifications from
    /// then on.
    async fn run(self) {
        let mut connection: Option<Connection> = None;
        let mut warned = false;
        let mut following: HashSet<String> = HashSet::new();
        let mut backoff = Backoff::new();
        let mut retry_at: Option<Instant> = None;
        loop {
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.waiters.changed() => {}
                () = retry => {}
                () = self.reconnect.notified() => {
                    if let Some(con) = &mut connection {
                        match self.reestablish(con).await {
                            Some(resubscribed) => following = resubscribed,
                            None => return,
                        }
                    }
                }
            }
            let Some(wanted) = self.waiters.channels() else {
                return;
            };
            let wanted: HashSet<String> = wanted.into_iter().collect();
            if let Some(con) = &mut connection {
                for channel in following.difference(&wanted) {
                    let _ = self.timed(con.unsubscribe(channel)).await;
                }
            }
            following.retain(|channel| wanted.contains(channel));
            let new: Vec<String> = wanted.difference(&following).cloned().collect();
            if !new.is_empty() {
                if connection.is_none() {
                    connection = self.connect(&mut warned).await;
                }
                let subscribed = match &mut connection {
                    Some(con) => self.timed(con.subscribe_all(&new)).await,
                    None => false,
                };
                if subscribed {
                    following.extend(new);
                } else {
                    retry_at = Some(Instant::now() + backoff.next_pause());
                    continue;
                }
            }
            retry_at = None;
            backoff = Backoff::new();
            // Also a channel followed all along: its waiters may be new (a slot made afresh).
            for channel in &following {
                self.waiters.followed(channel);
            }
        }
    }

    /// Pings until the connection is back, then subscribes again to every channel a local task
    /// waits on, backing off up to a second; then every waiting key retries once, for releases
    /// missed meanwhile. Returns the channels it follows (`None` once the hub is gone).
    async fn reestablish(&self, con: &mut Connection) -> Option<HashSet<String>> {
        let mut backoff = Backoff::new();
        loop {
            let channels = self.waiters.channels()?;
            if channels.is_empty() {
                // Nobody waits; the next subscription reconnects.
                return Some(HashSet::new());
            }
            // The client's automatic resubscription on reconnect was seen to miss (about one
            // reset in a hundred under load: reconnected, yet not subscribed), so the channels
            // are subscribed again here; a channel subscribed twice is confirmed, not doubled.
            // Any answer, even a refusal (an ACL without `+ping`), proves the connection is
            // back; only no answer at all is worth another try.
            if self.answered(con.ping()).await {
                if self.answered(con.subscribe_all(&channels)).await {
                    self.waiters.wake_every_key();
                    return Some(channels.into_iter().collect());
                }
            } else if let Source::Sentinel(_) = self.source {
                // The master may have moved: follow the sentinels rather than keep knocking.
                if let Some(moved) = self.connect(&mut true).await {
                    *con = moved;
                }
            }
            tokio::time::sleep(backoff.next_pause()).await;
        }
    }

    /// Wakes waiters right on the connection's reader task: a release notification reaches the
    /// waiter without passing through another task first (the handoff is latency-bound).
    fn push_sender(&self) -> impl redis::aio::AsyncPushSender {
        let waiters = self.waiters.clone();
        let reconnect = self.reconnect.clone();
        move |push: PushInfo| {
            let alive = match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    let text = |i: usize| {
                        push.data
                            .get(i)
                            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    };
                    match text(0) {
                        Some(channel) => waiters.deliver(
                            &channel,
                            &crate::backend::notification::read(&text(1).unwrap_or_default()),
                        ),
                        None => true,
                    }
                }
                // Messages may have been missed while disconnected: every waiting key retries
                // once now, and again once the subscriber has reconnected and resubscribed.
                PushKind::Disconnection => {
                    reconnect.notify_one();
                    waiters.wake_every_key()
                }
                _ => true,
            };
            if alive {
                Ok(())
            } else {
                Err(redis::aio::SendError)
            }
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
            Ok(Err(e)) => !unanswered(&e),
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
        // It runs on the I/O runtime, so its own reconnections do too.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.command))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1))
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
                    let node = self.source.node().to_string();
                    report::tell(move || {
                        tracing::warn!(
                            node,
                            error = %why,
                            "lock waiters cannot subscribe to release notifications (RESP3 \
                             pub/sub); falling back to jittered polling"
                        );
                    });
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
            Self::Server(c) => node_name(c.get_connection_info()),
            Self::Cluster(seeds) => seeds.node_name(),
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
