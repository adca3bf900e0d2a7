//! A Redis Cluster of three masters with a replica each, every node behind its own fault
//! proxy: nodes announce their proxy's port (`cluster-announce-port`), so clients reach them
//! only through the proxies, while the cluster bus stays direct (a black-holed master is cut
//! from its clients and its replica, not declared dead).
//!
//! Node 0 is the master serving the workload's key when the fault starts, node 1 its replica.
//! Besides the faults every node suffers, the key's slot can be migrated to another master.

use std::time::Duration;

use lock_tests::cluster::RedisCluster;
use lock_tests::proxy::Proxy;

use super::{poll, quick_connection, LockSystem, NodeFault};

pub struct Cluster {
    cluster: RedisCluster,
    /// `proxies[i]` relays to `cluster.nodes[i]`.
    proxies: Vec<Proxy>,
    slot: i64,
    /// The node index (into `cluster.nodes`) each fault was applied to, for its heal.
    hit: Option<usize>,
    /// A slot migration under way: (source, target) node indices.
    migrating: Option<(usize, usize)>,
}

impl Cluster {
    /// Starts the cluster; `key` is the lock key whose slot the faults follow.
    pub fn start(key: &str) -> Self {
        let cluster = RedisCluster::unformed(3, 1);
        let proxies: Vec<Proxy> = cluster
            .nodes
            .iter()
            .map(|n| Proxy::start(n.port()))
            .collect();
        for (node, proxy) in cluster.nodes.iter().zip(&proxies) {
            announce(node.port(), proxy.port());
        }
        let cluster = cluster.form();
        let slot = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut cluster.nodes[0].connection())
            .expect("CLUSTER KEYSLOT");
        let system = Self {
            cluster,
            proxies,
            slot,
            hit: None,
            migrating: None,
        };
        system.wait_whole();
        system
    }

    /// The indices of the master serving the slot and of its replica (if it has one), as a
    /// live node sees it.
    fn serving(&self) -> Option<(usize, Option<usize>)> {
        let by_proxy = |port: i64| {
            self.proxies
                .iter()
                .position(|p| i64::from(p.port()) == port)
        };
        for node in &self.cluster.nodes {
            let Some(mut con) = quick_connection(node.port()) else {
                continue;
            };
            let Ok(ranges) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<redis::Value>>(&mut con)
            else {
                continue;
            };
            for range in ranges {
                let redis::Value::Array(parts) = range else {
                    continue;
                };
                let (Some(redis::Value::Int(from)), Some(redis::Value::Int(to))) =
                    (parts.first(), parts.get(1))
                else {
                    continue;
                };
                if !(*from..=*to).contains(&self.slot) {
                    continue;
                }
                let port = |i: usize| match parts.get(i) {
                    Some(redis::Value::Array(node)) => match node.get(1) {
                        Some(redis::Value::Int(port)) => by_proxy(*port),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(master) = port(2) {
                    return Some((master, port(3)));
                }
            }
        }
        None
    }

    fn resolve(&self, node: usize) -> usize {
        let (master, replica) = self.serving().expect("a live node names the slot's master");
        match node {
            0 => master,
            1 => replica.expect("the slot's master has a replica"),
            _ => panic!("cluster faults hit node 0 (the key's master) or 1 (its replica)"),
        }
    }

    /// Waits until every node is up, the cluster is ok everywhere and the slot's master has a
    /// linked replica: a state in which a master may be killed again.
    fn wait_whole(&self) {
        poll("the cluster whole again", Duration::from_secs(60), || {
            let ok = self.cluster.nodes.iter().all(|n| {
                quick_connection(n.port()).is_some_and(|mut con| {
                    redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query::<String>(&mut con)
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                })
            });
            ok && self.serving().is_some_and(|(_, replica)| {
                replica
                    .and_then(|r| quick_connection(self.cluster.nodes[r].port()))
                    .is_some_and(|mut con| {
                        redis::cmd("INFO")
                            .arg("replication")
                            .query::<String>(&mut con)
                            .is_ok_and(|info| info.contains("master_link_status:up"))
                    })
            })
        });
    }
}

impl Cluster {
    fn id(&self, node: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.cluster.nodes[node].connection())
            .expect("CLUSTER MYID")
    }

    fn setslot(&self, node: usize, how: &str, id: &str) {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg(how)
            .arg(id)
            .query(&mut self.cluster.nodes[node].connection())
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {} {how}: {e}", self.slot));
    }

    /// Moves the lock key, its counter and its waiters' queue (those that exist), together,
    /// from `source` to `target`, on direct connections, as `redis-cli --cluster reshard` moves
    /// a slot's keys.
    /// Moves every key of the slot (the locks of every kind there, their fencing counters and
    /// waiters' queues) from `source` to `target`.
    fn move_keys(&self, source: usize, target: usize) {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(10_000)
            .query(&mut self.cluster.nodes[source].connection())
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.cluster.nodes[target].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut self.cluster.nodes[source].connection())
            .expect("MIGRATE");
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE: {reply}");
    }

    fn start_migration(&mut self, source: usize) {
        let target = (0..self.cluster.nodes.len())
            .find(|&i| {
                i != source
                    && redis::cmd("ROLE")
                        .query::<Vec<redis::Value>>(&mut self.cluster.nodes[i].connection())
                        .is_ok_and(|r| matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
            })
            .expect("another master");
        self.setslot(target, "IMPORTING", &self.id(source));
        self.setslot(source, "MIGRATING", &self.id(target));
        self.move_keys(source, target);
        self.migrating = Some((source, target));
    }

    fn finish_migration(&mut self) {
        let (source, target) = self.migrating.take().expect("a migration under way");
        self.move_keys(source, target);
        let id = self.id(target);
        // The target first, then the source, as `redis-cli --cluster reshard` does; then every
        // other master.
        self.setslot(target, "NODE", &id);
        self.setslot(source, "NODE", &id);
        for i in 0..self.cluster.nodes.len() {
            let master = redis::cmd("ROLE")
                .query::<Vec<redis::Value>>(&mut self.cluster.nodes[i].connection())
                .is_ok_and(
                    |r| matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"),
                );
            if i != source && i != target && master {
                self.setslot(i, "NODE", &id);
            }
        }
        poll(
            "every node names the slot's new master",
            Duration::from_secs(30),
            || self.serving().is_some_and(|(master, _)| master == target),
        );
    }
}

/// Makes node `port` announce `proxy` to clients, with its cluster bus left direct.
fn announce(port: u16, proxy: u16) {
    let mut con = quick_connection(port).expect("a started node answers");
    for (name, value) in [
        ("cluster-announce-port", proxy),
        ("cluster-announce-bus-port", port + 10_000),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut con)
            .expect("CONFIG SET");
    }
}

impl LockSystem for Cluster {
    fn name(&self) -> &'static str {
        "cluster of 3 masters with a replica each"
    }

    fn worker_args(&self) -> Vec<String> {
        let urls: Vec<String> = self.proxies.iter().map(Proxy::url).collect();
        vec![
            "--backend".into(),
            "cluster".into(),
            "--lock-url".into(),
            urls.join(","),
        ]
    }

    fn observed(&self) -> Vec<Vec<u16>> {
        vec![self
            .cluster
            .nodes
            .iter()
            .map(lock_tests::RedisServer::port)
            .collect()]
    }

    fn server_ports(&self) -> Vec<u16> {
        let servers = self.cluster.nodes.iter().map(lock_tests::RedisServer::port);
        servers
            .chain(self.proxies.iter().map(Proxy::port))
            .collect()
    }

    fn quorum(&self) -> usize {
        1
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        let i = self.resolve(node);
        self.hit = Some(i);
        if fault == NodeFault::MigrateSlot {
            self.start_migration(i);
            return;
        }
        super::inject(&mut self.cluster.nodes[i], &self.proxies[i], fault);
    }

    fn heal(&mut self, _node: usize, fault: NodeFault) {
        let i = self.hit.take().expect("a fault to heal");
        match fault {
            NodeFault::MigrateSlot => self.finish_migration(),
            NodeFault::Kill(_) => {
                // Its replica takes over first; the node then comes back and follows it.
                poll("a replica promoted", Duration::from_secs(30), || {
                    self.serving().is_some_and(|(master, _)| master != i)
                });
                super::heal(&mut self.cluster.nodes[i], &self.proxies[i], fault);
                announce(self.cluster.nodes[i].port(), self.proxies[i].port());
            }
            _ => super::heal(&mut self.cluster.nodes[i], &self.proxies[i], fault),
        }
        self.wait_whole();
    }

    fn proxy_counts(&self) -> (u64, u64) {
        self.proxies.iter().fold((0, 0), |(d, r), p| {
            let s = p.stats();
            (d + s.replies_dropped(), r + s.resets())
        })
    }
}
