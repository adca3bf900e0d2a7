//! A real Redis Cluster on loopback, built from `redis-server --cluster-enabled yes` processes
//! and `redis-cli --cluster create`.

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
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &self.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(std::process::Stdio::null());
        let out = match create.output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{}", crate::INSTALL_HINT),
            Err(e) => panic!("could not run redis-cli: {e}"),
        };
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
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
