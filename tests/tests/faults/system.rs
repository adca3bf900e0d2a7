//! The lock deployment under test, and the server-side and network faults it can suffer.
//!
//! The workload and its checks only talk to a [`LockSystem`]: which arguments make a worker use
//! it, who holds a lock right now, how the servers' history is recorded for the checks, how
//! many servers must agree for a lock to be held, and how to hurt node `n`. What a node index
//! means is the deployment's to say: the one server, the n-th Redlock master, the master (0) or
//! replica (1) serving the workload's key. The Redis deployments share the answers read off
//! their servers directly (`GET`, `PTTL`, `MONITOR`); Postgres reads its tables.

use std::collections::HashMap;
use std::time::Duration;

use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;

use super::changes::Change;
use super::monitor::{Event, Monitor, Pulse};

pub mod cluster;
pub mod postgres;
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
    /// Postgres: a session takes the holders' table in `ACCESS EXCLUSIVE` mode and keeps it
    /// until healed, so every statement of the store hangs on it.
    HungStatement,
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
            Self::HungStatement => "statement-hung",
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
    /// The token a quorum of the servers holds lock `key` alone for, asked directly.
    fn holder(&self, key: &str) -> Option<String> {
        let mut tokens: HashMap<String, usize> = HashMap::new();
        for group in self.observed() {
            let token = group.iter().find_map(|port| {
                redis::cmd("GET")
                    .arg(format!("lock:{key}"))
                    .query::<Option<String>>(&mut quick_connection(*port)?)
                    .ok()
                    .flatten()
            });
            if let Some(token) = token {
                *tokens.entry(token).or_default() += 1;
            }
        }
        let quorum = self.quorum();
        tokens
            .into_iter()
            .find(|(_, n)| *n >= quorum)
            .map(|(t, _)| t)
    }
    /// Lock `key`'s remaining lease in ms, as the first server that has it says (-3: none).
    fn pttl(&self, key: &str) -> i64 {
        self.observed()
            .iter()
            .flatten()
            .find_map(|port| {
                redis::cmd("PTTL")
                    .arg(format!("lock:{key}"))
                    .query::<i64>(&mut quick_connection(*port)?)
                    .ok()
                    .filter(|p| *p >= 0)
            })
            .unwrap_or(-3)
    }
    /// The tokens queued for lock `key`, oldest first, as the first server that answers says
    /// (none where waiters do not queue).
    fn queued(&self, key: &str) -> Vec<String> {
        self.observed()
            .iter()
            .flatten()
            .find_map(|port| {
                redis::cmd("ZRANGE")
                    .arg(format!("queue:{{lock:{key}}}"))
                    .arg(0)
                    .arg(-1)
                    .query::<Vec<String>>(&mut quick_connection(*port)?)
                    .ok()
                    .filter(|queued| !queued.is_empty())
            })
            .unwrap_or_default()
    }
    /// Starts recording what the servers do, for the checks; returns once recording.
    fn record(&self) -> Box<dyn Recorder> {
        Box::new(Monitors::start(self.observed(), self.server_ports()))
    }
}

/// What the servers did during a run, as the checks read it.
pub struct Recorded {
    /// Redis: per copy of the data, per server, what `MONITOR` showed it run for clients.
    pub events: Vec<Vec<Vec<Event>>>,
    /// Postgres: every change to the holders' table, in the order they were made.
    pub changes: Option<Vec<Change>>,
    /// Locks left with no expiry, or with more lease than a ttl can give, at the end.
    pub leftover_without_ttl: Vec<String>,
}

/// Records a run (see [`LockSystem::record`]).
pub trait Recorder {
    /// Everything the servers did up to this call, once the workers have stopped.
    fn finish(self: Box<Self>) -> Recorded;
}

/// `MONITOR` on every observed Redis server, by copy of the data, with a [`Pulse`] to each,
/// and at the end a scan for lock keys left without an expiry.
struct Monitors {
    monitors: Vec<Vec<Monitor>>,
    pulses: Vec<Pulse>,
    /// Ports servers replicate from: their commands are no client's.
    links: Vec<u16>,
}

impl Monitors {
    fn start(groups: Vec<Vec<u16>>, links: Vec<u16>) -> Self {
        let monitors = groups
            .iter()
            .map(|g| g.iter().map(|p| Monitor::start(*p)).collect())
            .collect();
        let pulses = groups.iter().flatten().map(|p| Pulse::start(*p)).collect();
        Self {
            monitors,
            pulses,
            links,
        }
    }
}

impl Recorder for Monitors {
    fn finish(mut self: Box<Self>) -> Recorded {
        self.pulses.clear();
        for m in self.monitors.iter().flatten() {
            m.sync();
        }
        // A replica's MONITOR also shows what its master replicates to it: the master's
        // history already has it.
        let from_clients = |events: Vec<Event>| -> Vec<Event> {
            events
                .into_iter()
                .filter(|e| !matches!(e, Event::Command(c) if c.peer_port.is_some_and(|p| self.links.contains(&p))))
                .collect()
        };
        let events = self
            .monitors
            .iter()
            .map(|g| g.iter().map(|m| from_clients(m.events())).collect())
            .collect();
        let mut leftover_without_ttl = Vec::new();
        for port in self.monitors.iter().flatten().map(Monitor::port) {
            let mut con = lock_tests::connection(&format!("redis://127.0.0.1:{port}/"));
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("lock:*")
                .query(&mut con)
                .expect("KEYS");
            for k in keys {
                // A cluster replica lists its master's keys but redirects reads of them: the
                // master's own scan judges those.
                let pttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut con).unwrap_or(-2);
                if pttl < 0 && pttl != -2 {
                    leftover_without_ttl.push(format!("{k} on port {port} (PTTL {pttl})"));
                }
            }
        }
        Recorded {
            events,
            changes: None,
            leftover_without_ttl,
        }
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
        NodeFault::HungStatement => panic!("a hung statement is Postgres's"),
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
        NodeFault::HungStatement => panic!("a hung statement is Postgres's"),
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
