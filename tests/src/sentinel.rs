//! A Redis Sentinel deployment on loopback: a master, one replica, and three sentinels that
//! monitor the master as `mymaster` with a quorum of two.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::RedisServer;

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Starts the servers and waits until the replica is linked and every sentinel knows the
    /// replica and the two other sentinels (a failover needs all of that).
    ///
    /// # Panics
    /// When `redis-server` is missing or the deployment does not come together in 30 s.
    #[must_use]
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        poll("the replica linked to the master", || {
            info(&replica, "replication").contains("master_link_status:up")
        });
        let config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SERVICE} 500\n\
             sentinel failover-timeout {SERVICE} 5000\n",
            master.port()
        );
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_configured(&config, &["--sentinel"], "+monitor master"))
            .collect();
        for sentinel in &sentinels {
            poll("each sentinel knows the replica and the others", || {
                let mut con = sentinel.connection();
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(SERVICE)
                    .query(&mut con)
                    .unwrap_or_default();
                let peers: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(SERVICE)
                    .query(&mut con)
                    .unwrap_or_default();
                replicas.len() == 1 && peers.len() == 2
            });
        }
        Self {
            master,
            replica,
            sentinels,
        }
    }

    /// The sentinels' URLs, as a registry is given them.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// Subscribes to the first sentinel's `+switch-master` events; call before the fault.
    ///
    /// # Panics
    /// When the sentinel does not answer.
    pub async fn watch_switch(&self) -> SwitchWatch {
        let mut pubsub = self.sentinels[0]
            .client()
            .get_async_pubsub()
            .await
            .expect("connect to a sentinel");
        pubsub
            .subscribe("+switch-master")
            .await
            .expect("subscribe to +switch-master");
        SwitchWatch { pubsub }
    }
}

/// A subscription to a sentinel's `+switch-master` channel.
pub struct SwitchWatch {
    pubsub: redis::aio::PubSub,
}

impl SwitchWatch {
    /// Waits for the next failover and returns the new master's port.
    ///
    /// # Panics
    /// When no failover is announced within 30 s.
    pub async fn wait(mut self) -> u16 {
        let mut messages = self.pubsub.on_message();
        let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .expect("a +switch-master event within 30 s")
            .expect("the sentinel connection stays open");
        // "<name> <old ip> <old port> <new ip> <new port>"
        let payload: String = message.get_payload().expect("text payload");
        payload
            .split(' ')
            .nth(4)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected +switch-master payload {payload:?}"))
    }
}

fn info(server: &RedisServer, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut server.connection())
        .unwrap_or_default()
}

/// Polls server-side state that has no event to wait for (a replica's link, sentinels
/// discovering each other through hello messages every 2 s).
fn poll(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}
