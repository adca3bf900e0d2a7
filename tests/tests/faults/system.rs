//! The lock deployment under test, and the server-side and network faults it can suffer.
//!
//! The workload and its checks only talk to a [`LockSystem`]: which arguments make a worker use
//! it, which servers to observe directly, how many of them must agree for a lock to be held,
//! and how to hurt node `n`. A single node is implemented here; a Redis Cluster or Redlock
//! deployment is another implementation (one `RedisServer` and `Proxy` per node, workers
//! started with that backend's `--backend`, `quorum()` the majority), with the same schedule
//! and the same invariants.

use std::time::Duration;

use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;

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
        }
    }
}

pub trait LockSystem {
    /// For the summary.
    fn name(&self) -> &'static str;
    /// `fault-worker` arguments that select this backend.
    fn worker_args(&self) -> Vec<String>;
    /// Ports of the servers to observe directly (MONITOR, final scans), bypassing every fault.
    fn observed_ports(&self) -> Vec<u16>;
    /// How many nodes must hold a lock for it to be held.
    fn quorum(&self) -> usize;
    fn inject(&mut self, node: usize, fault: NodeFault);
    fn heal(&mut self, node: usize, fault: NodeFault);
    /// Counters of the fault proxies, for the summary: (replies dropped, connections reset).
    fn proxy_counts(&self) -> (u64, u64);
}

/// One redis-server behind one fault proxy.
pub struct SingleNode {
    pub server: RedisServer,
    pub proxy: Proxy,
}

impl SingleNode {
    pub fn start() -> Self {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        Self { server, proxy }
    }
}

impl LockSystem for SingleNode {
    fn name(&self) -> &'static str {
        "single node"
    }

    fn worker_args(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            "single".into(),
            "--lock-url".into(),
            self.proxy.url(),
        ]
    }

    fn observed_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    fn quorum(&self) -> usize {
        1
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "a single node");
        match fault {
            NodeFault::Latency(d) => self.proxy.set_latency(d),
            NodeFault::Blackhole => self.proxy.blackhole(),
            NodeFault::DropReplies => self.proxy.drop_replies(),
            NodeFault::ResetConnections => self.proxy.reset_all(),
            NodeFault::PauseServer => self.server.pause(),
        }
    }

    fn heal(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "a single node");
        match fault {
            NodeFault::Latency(_) | NodeFault::Blackhole | NodeFault::DropReplies => {
                self.proxy.heal();
            }
            NodeFault::PauseServer => self.server.resume(),
            NodeFault::ResetConnections => {}
        }
    }

    fn proxy_counts(&self) -> (u64, u64) {
        let s = self.proxy.stats();
        (s.replies_dropped(), s.resets())
    }
}
