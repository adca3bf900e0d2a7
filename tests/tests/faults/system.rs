//! The lock deployment under test, and the server-side and network faults it can suffer.
//!
//! The workload and its checks only talk to a [`LockSystem`]: which arguments make a worker use
//! it, which servers to observe directly, how many of them must agree for a lock to be held,
//! and how to hurt node `n`. What a node index means is the deployment's to say: the one server,
//! the n-th Redlock master, the master (0) or replica (1) serving the workload's key.

use std::time::Duration;

use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;

pub mod cluster;
pub mod redlock;
pub mod sentinel;
pub mod single;

/// A fault that hits a server or the network in front of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeFault {
    /// Every chunk delayed this much in each direction.
    Latency(Duration),
    /// Nothing delivered until healed; then delivered late, in order.
    Blackhole,
    /// Requests run, replies vanish; connections that lost replies are reset on heal.
    DropReplies,
    /// Every connection reset at once (healing is a no-op).
    ResetConnections,
    /// SIGSTOP of redis-server until healed (SIGCONT).
    PauseServer,
    /// kill -9 of redis-server; healing starts it again on the same port, with or without the
    /// data it had (append-only file, fsync always). Where replicas take over, healing first
    /// waits for the failover and brings the old node back as a replica.
    Kill(Restart),
    /// Redis Cluster: the key's slot starts moving to another master (`CLUSTER SETSLOT`
    /// `IMPORTING`/`MIGRATING`) and its keys are moved at once (`MIGRATE`), so the old master
    /// answers `ASK` for them; healing moves what is left and gives the slot to the new
    /// master, which every node then names (`MOVED`).
    MigrateSlot,
}

/// What a killed server comes back with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Nothing: a restart without persistence.
    Empty,
    /// Everything it had acknowledged (append-only file, fsync always).
    FromDisk,
}

impl NodeFault {
    pub fn kind(self) -> &'static str {
        match self {
            Self::Latency(d) if d >= Duration::from_millis(150) => "latency-high",
            Self::Latency(_) => "latency-low",
            Self::Blackhole => "blackhole",
            Self::DropReplies => "drop-replies",
            Self::ResetConnections => "reset",
            Self::PauseServer => "server-sigstop",
            Self::Kill(Restart::Empty) => "server-kill-restart-empty",
            Self::Kill(Restart::FromDisk) => "server-kill-restart-from-disk",
            Self::MigrateSlot => "slot-migration",
        }
    }
}

pub trait LockSystem {
    /// For the summary.
    fn name(&self) -> &'static str;
    /// `fault-worker` arguments that select this backend.
    fn worker_args(&self) -> Vec<String>;
    /// Ports of the servers to observe directly (MONITOR, final scans), bypassing every fault,
    /// in groups: each group is one copy of the data (a server; a master with the replicas
    /// that may take over from it), whose servers' histories merge into one.
    fn observed(&self) -> Vec<Vec<u16>>;
    /// Ports that servers connect to each other on (a replica to its master, directly or
    /// through a proxy): what arrives from them is replication, not a client's command.
    fn server_ports(&self) -> Vec<u16> {
        self.observed().into_iter().flatten().collect()
    }
    /// How many groups must hold a lock for it to be held.
    fn quorum(&self) -> usize;
    /// Whether waiters queue beside the lock (not on Redlock, nor with `confirm_replicas`).
    fn queues(&self) -> bool {
        self.quorum() == 1
    }
    /// How long a worker's reader pauses between sections. Where a waiting writer does not
    /// hold new readers off (waiters do not queue), readers one after another can keep the
    /// read-write lock from ever being free for it.
    fn read_pause(&self) -> Duration {
        Duration::from_millis(10)
    }
    /// Whether locks carry fencing tokens in this mode.
    fn fencing(&self) -> bool {
        true
    }
    fn inject(&mut self, node: usize, fault: NodeFault);
    /// Ends `fault`; returns once the deployment is whole again.
    fn heal(&mut self, node: usize, fault: NodeFault);
    /// Counters of the fault proxies, for the summary: (replies dropped, connections reset).
    fn proxy_counts(&self) -> (u64, u64);
    /// Logs worth keeping with a failed run, as (file name, lines): what the servers' histories
    /// cannot show (a sentinel's view of a failover).
    fn logs(&self) -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
}

/// One server behind one proxy: the network and process faults every mode shares.
pub struct Node {
    pub server: RedisServer,
    pub proxy: Proxy,
}

impl Node {
    /// A server (with `extra` arguments) behind a fault proxy.
    pub fn start(extra: &[&str]) -> Self {
        let server = RedisServer::start_with(extra);
        let proxy = Proxy::start(server.port());
        Self { server, proxy }
    }

    /// A server that keeps what it acknowledged across a kill (append-only file, fsync always).
    pub fn start_persistent() -> Self {
        Self::start(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    pub fn inject(&mut self, fault: NodeFault) {
        inject(&mut self.server, &self.proxy, fault);
    }

    pub fn heal(&mut self, fault: NodeFault) {
        heal(&mut self.server, &self.proxy, fault);
    }

    pub fn proxy_counts(&self) -> (u64, u64) {
        let s = self.proxy.stats();
        (s.replies_dropped(), s.resets())
    }
}

/// Applies `fault` to one server and the proxy in front of it: every fault but a slot
/// migration, which needs a cluster.
pub fn inject(server: &mut RedisServer, proxy: &Proxy, fault: NodeFault) {
    match fault {
        NodeFault::Latency(d) => proxy.set_latency(d),
        NodeFault::Blackhole => proxy.blackhole(),
        NodeFault::DropReplies => proxy.drop_replies(),
        NodeFault::ResetConnections => proxy.reset_all(),
        NodeFault::PauseServer => server.pause(),
        NodeFault::Kill(_) => server.kill(),
        NodeFault::MigrateSlot => panic!("a slot migration needs a cluster"),
    }
}

/// Ends what [`inject`] did; a killed server comes back as `Restart` says. Clients reach it
/// again only once `MONITOR` watches the new process (the workload's monitors reconnect on
/// their own): a command it ran before would be missing from its history, and the checker
/// would misread everything that follows on that key.
pub fn heal(server: &mut RedisServer, proxy: &Proxy, fault: NodeFault) {
    match fault {
        NodeFault::Latency(_) | NodeFault::Blackhole | NodeFault::DropReplies => proxy.heal(),
        NodeFault::PauseServer => server.resume(),
        NodeFault::ResetConnections => {}
        NodeFault::Kill(restart) => {
            proxy.blackhole();
            restart_as(server, restart);
            until_monitored(server.port());
            proxy.heal();
        }
        NodeFault::MigrateSlot => panic!("a slot migration needs a cluster"),
    }
}

/// Starts a killed server again, with its data or without.
pub fn restart_as(server: &mut RedisServer, restart: Restart) {
    match restart {
        Restart::FromDisk => server.restart(),
        Restart::Empty => server.restart_empty(),
    }
}

/// Until a `MONITOR` client is attached to the server on `port`.
pub fn until_monitored(port: u16) {
    poll(
        "MONITOR attached to the restarted server",
        Duration::from_secs(10),
        || {
            quick_connection(port).is_some_and(|mut con| {
                // A monitoring client carries the flag `O`.
                redis::cmd("CLIENT")
                    .arg("LIST")
                    .query::<String>(&mut con)
                    .is_ok_and(|list| {
                        list.lines()
                            .any(|client| client.split(' ').any(|field| field == "flags=O"))
                    })
            })
        },
    );
}

/// Sums the proxies' counters.
pub fn total_counts<'a>(nodes: impl Iterator<Item = &'a Node>) -> (u64, u64) {
    nodes
        .map(Node::proxy_counts)
        .fold((0, 0), |(d, r), (d2, r2)| (d + d2, r + r2))
}

/// Polls server state that has no event to wait for (a failover, a replica's link).
pub fn poll(what: &str, limit: Duration, ready: impl FnMut() -> bool) {
    poll_explained(what, limit, ready, String::new);
}

/// [`poll`], with what `explain` tells of the servers' state if it times out.
pub fn poll_explained(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = std::time::Instant::now() + limit;
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {limit:?}\n{}",
            explain()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A direct connection to `127.0.0.1:<port>` with short timeouts, or `None` if it does not
/// answer (a stopped or dead server).
pub fn quick_connection(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let con = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    con.set_write_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    Some(con)
}
