//! A real Redis Cluster on loopback, built from `redis-server --cluster-enabled yes` processes
//! and `redis-cli --cluster create`, and slot migrations done by hand on it.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// A cluster of `masters` masters, each with `replicas` replicas, that keeps serving the slots
/// of live masters when one dies (`cluster-require-full-coverage no`).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts the servers, joins them and waits until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    /// When `redis-server`/`redis-cli` are missing or the cluster does not form.
    #[must_use]
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::unformed(masters, replicas).form()
    }

    /// Starts the servers of a cluster without joining them: no node serves any slot until
    /// [`form`](Self::form) (for clients that start before their cluster is ready).
    ///
    /// # Panics
    /// When `redis-server` is missing.
    #[must_use]
    pub fn unformed(masters: usize, replicas: usize) -> Self {
        let count = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-require-full-coverage",
                    "no",
                    // A replica of a quiet master may always take over: the tests kill masters
                    // right after writing.
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        Self { nodes, masters }
    }

    /// Joins the nodes with `redis-cli --cluster create` and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    /// When `redis-cli` is missing or the cluster does not form.
    #[must_use]
    pub fn form(self) -> Self {
        let cluster = self.create();
        cluster.wait_until_ok();
        cluster
    }

    /// Joins the nodes with `redis-cli --cluster create` and returns as soon as it does, before
    /// every node agrees on the slots: what a client started right after it meets.
    ///
    /// # Panics
    /// When `redis-cli` is missing or fails.
    #[must_use]
    pub fn create(self) -> Self {
        let replicas = self.nodes.len() / self.masters - 1;
        let cli = crate::server::cli_binary();
        let mut create = Command::new(&cli);
        create.arg("--cluster").arg("create");
        for node in &self.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(std::process::Stdio::null());
        let out = match create.output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("{cli} was not found. {}", crate::INSTALL_HINT)
            }
            Err(e) => panic!("could not run {cli}: {e}"),
        };
        assert!(
            out.status.success(),
            "{cli} --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self
    }

    /// Seed URLs of every node.
    #[must_use]
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    #[must_use]
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// Polls `CLUSTER INFO` on every node: forming a cluster has no event to wait for.
    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &self.nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not become ok:\n{info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts moving the slot of the Redis key `key` from its master to another master, as
    /// `redis-cli --cluster reshard` does: the target marks it importing, the source migrating.
    /// Until [`Migration::finish`], the source answers `ASK` for the slot's keys it no longer
    /// has, and `TRYAGAIN` for a command whose keys are split between the two.
    ///
    /// # Panics
    /// When the cluster has a single master or a node refuses.
    #[must_use]
    pub fn migrate_slot_of(&self, key: &str) -> Migration<'_> {
        let via = &self.nodes[0];
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut via.connection())
            .unwrap();
        let source_port = self.master_port_of(via, key);
        let source = self.index_of(source_port);
        let target = (0..self.nodes.len())
            .find(|&i| i != source && self.is_master(&self.nodes[i]))
            .expect("a second master");
        let migration = Migration {
            cluster: self,
            key: key.to_owned(),
            slot,
            source,
            target,
        };
        let (source_id, target_id) = (migration.id(source), migration.id(target));
        migration.setslot(target, "IMPORTING", &source_id);
        migration.setslot(source, "MIGRATING", &target_id);
        migration
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("a node of this cluster")
    }

    fn is_master(&self, node: &RedisServer) -> bool {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut node.connection()).unwrap();
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
    }

    /// The port of the master that serves `key`, asked from a live node.
    ///
    /// # Panics
    /// When no live node answers.
    #[must_use]
    pub fn master_port_of(&self, via: &RedisServer, key: &str) -> u16 {
        let mut con = via.connection();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .unwrap();
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(from)),
                Some(redis::Value::Int(to)),
                Some(redis::Value::Array(master)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*from..=*to).contains(&slot) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return u16::try_from(*port).unwrap();
                }
            }
        }
        panic!("no master serves slot {slot}");
    }
}

/// A slot on its way from one master to another; see [`RedisCluster::migrate_slot_of`].
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    key: String,
    slot: u16,
    source: usize,
    target: usize,
}

impl Migration<'_> {
    /// The master that owned the slot.
    #[must_use]
    pub fn source(&self) -> &RedisServer {
        &self.cluster.nodes[self.source]
    }

    /// The master the slot is moving to.
    #[must_use]
    pub fn target(&self) -> &RedisServer {
        &self.cluster.nodes[self.target]
    }

    /// Moves `keys` (those that exist) to the target in one `MIGRATE`, so a lock and its
    /// fencing counter never live on different nodes.
    ///
    /// # Panics
    /// When `MIGRATE` fails.
    pub fn move_keys(&self, keys: &[&str]) {
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.target().port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(&mut self.source().connection())
            .unwrap_or_else(|e| panic!("MIGRATE {keys:?}: {e}"));
        assert!(
            reply == "OK" || reply == "NOKEY",
            "MIGRATE {keys:?}: {reply}"
        );
    }

    /// `key`'s value on the source, `None` when it has no such key.
    ///
    /// # Panics
    /// When the source does not answer.
    #[must_use]
    pub fn on_source(&self, key: &str) -> Option<String> {
        match redis::cmd("GET")
            .arg(key)
            .query(&mut self.source().connection())
        {
            Ok(value) => value,
            // A key the source does not have is asked of the target.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => None,
            Err(e) => panic!("GET {key} on the source: {e}"),
        }
    }

    /// `key`'s value on the target, asked with `ASKING` while the slot is not its yet.
    ///
    /// # Panics
    /// When the target does not answer.
    #[must_use]
    pub fn on_target(&self, key: &str) -> Option<String> {
        let (value,): (Option<String>,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("GET")
            .arg(key)
            .query(&mut self.target().connection())
            .unwrap_or_else(|e| panic!("GET {key} on the target: {e}"));
        value
    }

    /// Moves every key still on the source, gives the slot to the target on every master, and
    /// waits until every node says the target serves it. From then on the source answers
    /// `MOVED`.
    ///
    /// # Panics
    /// When a node refuses or the nodes do not agree within 30 s.
    pub fn finish(self) {
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(1000)
                .query(&mut self.source().connection())
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.move_keys(&keys);
        }
        let target_id = self.id(self.target);
        // The target first, then the source, as `redis-cli --cluster reshard` does; then the
        // other masters, so no node sends clients back to the source.
        self.setslot(self.target, "NODE", &target_id);
        self.setslot(self.source, "NODE", &target_id);
        for i in 0..self.cluster.nodes.len() {
            if i != self.source
                && i != self.target
                && self.cluster.is_master(&self.cluster.nodes[i])
            {
                self.setslot(i, "NODE", &target_id);
            }
        }
        // Polls `CLUSTER SLOTS`: the nodes' agreement has no event to wait for.
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &self.cluster.nodes {
            while self.cluster.master_port_of(node, &self.key) != self.target().port() {
                assert!(
                    Instant::now() < deadline,
                    "port {} does not see slot {} on the target",
                    node.port(),
                    self.slot
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn id(&self, node: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.cluster.nodes[node].connection())
            .unwrap()
    }

    fn setslot(&self, node: usize, state: &str, id: &str) {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg(state)
            .arg(id)
            .query(&mut self.cluster.nodes[node].connection())
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {} {state}: {e}", self.slot));
    }
}
