//! A Redis Sentinel deployment on loopback: a master, one replica, and three sentinels that
//! monitor the master as `mymaster` with a quorum of two.
//!
//! [`RedisSentinels::start_partitionable`] puts the master behind a fault [`Proxy`] that can cut
//! it off from the sentinels and the replica while every other client still reaches it: the
//! replica and the sentinels connect from loopback addresses of their own
//! ([`REPLICA_SOURCE`], [`SENTINEL_SOURCE`], through redis' `bind-source-addr`), clients from
//! `127.0.0.1`, and the proxy black-holes connections by source address.
//!
//! [`RedisSentinels::start_tls`] makes every server speak only TLS, with one throwaway CA:
//! the replica replicates and the sentinels monitor, and talk to each other, over TLS.
//!
//! [`RedisSentinels::start_min_replicas`] runs the servers as a lock deployment should
//! ([`MIN_REPLICAS_ARGS`]): a master without a replica in sync refuses writes.
//!
//! The sentinels judge a server down after [`DOWN_AFTER`].

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::proxy::Proxy;
use crate::{Certificates, RedisServer};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

/// Where the replica's replication link comes from in a partitionable deployment.
pub const REPLICA_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Where every sentinel's links come from in a partitionable deployment.
pub const SENTINEL_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// The sentinels' `down-after-milliseconds`. A sentinel reconnects to a server at most once a
/// second, and on `+switch-master` it restarts the new master's ping clock: below about a
/// second, it can judge a just-promoted, healthy master down before it has reconnected to it
/// and fail over again, to whatever replica is left (an old master back a moment ago, before
/// its first sync). Five seconds leave that reconnect, and a loaded machine, room.
pub const DOWN_AFTER: Duration = Duration::from_secs(5);

/// What every server of [`RedisSentinels::start_min_replicas`] runs with: a master refuses
/// writes unless a replica in sync acknowledged within the last 10 s, so a master that lost its
/// replica (promoted away from it, or not yet joined after a failover) takes no lock.
pub const MIN_REPLICAS_ARGS: [&str; 4] = [
    "--min-replicas-to-write",
    "1",
    "--min-replicas-max-lag",
    "10",
];

pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
    /// In front of the master, in a partitionable deployment: the address the replica follows
    /// and the sentinels monitor, and so the one clients are given.
    front: Option<Proxy>,
}

impl RedisSentinels {
    /// Starts the servers and waits until the replica is linked and every sentinel knows the
    /// replica and the two other sentinels (a failover needs all of that).
    ///
    /// # Panics
    /// When `redis-server` is missing or the deployment does not come together in 30 s.
    #[must_use]
    pub fn start() -> Self {
        Self::start_inner(false, None, &[])
    }

    /// As [`start`](Self::start), every server with [`MIN_REPLICAS_ARGS`] (kept across
    /// restarts): the deployment the fault workload runs with `confirm_replicas(1)`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_min_replicas() -> Self {
        Self::start_inner(false, None, &MIN_REPLICAS_ARGS)
    }

    /// As [`start`](Self::start), every server listening only for TLS (`--port 0`,
    /// `--tls-port`) with certificates from one throwaway CA ([`ca_pem`](Self::ca_pem)), and
    /// `tls-replication yes`: the replica follows the master over TLS, and the sentinels
    /// monitor the servers and talk to each other over TLS.
    ///
    /// # Panics
    /// As [`start`](Self::start), or when `openssl` is missing.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_inner(false, Some(Arc::new(Certificates::make())), &[])
    }

    /// As [`start`](Self::start), with the master reached through a proxy that
    /// [`partition_master`](Self::partition_master) can cut for the sentinels and the replica
    /// alone.
    ///
    /// Redis 7 binds replication links and sentinel links (to masters, replicas and other
    /// sentinels) to `bind-source-addr`; the sentinels announce `127.0.0.1` to each other,
    /// where they listen.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_partitionable() -> Self {
        Self::start_inner(true, None, &[])
    }

    fn start_inner(
        partitionable: bool,
        tls: Option<Arc<Certificates>>,
        server_args: &[&str],
    ) -> Self {
        let server = |args: &[&str]| {
            let args = [server_args, args].concat();
            match &tls {
                Some(certs) => RedisServer::start_tls_with(certs, &args),
                None => RedisServer::start_with(&args),
            }
        };
        let master = server(&[]);
        let front = partitionable.then(|| Proxy::start(master.port()));
        // The master's address as the replica and the sentinels know it.
        let master_port = front.as_ref().map_or(master.port(), Proxy::port);
        let replica_source = REPLICA_SOURCE.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1"];
        let master_port_arg = master_port.to_string();
        replica_args.push(&master_port_arg);
        if partitionable {
            replica_args.extend(["--bind-source-addr", replica_source.as_str()]);
        }
        let replica = server(&replica_args);
        poll("the replica linked to the master", || {
            info(&replica, "replication").contains("master_link_status:up")
        });
        let down_after = DOWN_AFTER.as_millis();
        let mut config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {SERVICE} {down_after}\n\
             sentinel failover-timeout {SERVICE} 5000\n"
        );
        if partitionable {
            config.push_str(&format!(
                "bind-source-addr {SENTINEL_SOURCE}\nsentinel announce-ip 127.0.0.1\n"
            ));
        }
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| match &tls {
                Some(certs) => RedisServer::start_configured_tls(
                    certs,
                    &config,
                    &["--sentinel"],
                    "+monitor master",
                ),
                None => RedisServer::start_configured(&config, &["--sentinel"], "+monitor master"),
            })
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
            front,
        }
    }

    /// Cuts the master off from the sentinels and the replica, in both directions, while every
    /// other client (connecting from `127.0.0.1`) still reaches it: the sentinels see it down
    /// and promote the replica, the replica hears nothing more from it, and a lock holder goes
    /// on talking to it.
    ///
    /// # Panics
    /// For a deployment not started with [`start_partitionable`](Self::start_partitionable).
    pub fn partition_master(&self) {
        self.front
            .as_ref()
            .expect("a deployment started with start_partitionable")
            .partition(&[REPLICA_SOURCE, SENTINEL_SOURCE]);
    }

    /// The sentinels' URLs, as a registry is given them (`rediss://` in a TLS deployment).
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The PEM of the CA of a TLS deployment ([`start_tls`](Self::start_tls)).
    ///
    /// # Panics
    /// For a deployment without TLS.
    #[must_use]
    pub fn ca_pem(&self) -> Vec<u8> {
        self.master.ca_pem()
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
