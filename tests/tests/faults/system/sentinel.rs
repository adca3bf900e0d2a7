//! Redis Sentinel: a master, a replica and three sentinels (`lock_tests::sentinel`). Node 0 is
//! whichever server the sentinels name as master when the fault starts, node 1 the other.
//!
//! Run as `GUARANTEES.md` says a lock deployment must be for exclusion to hold across a
//! failover: the servers with `min-replicas-to-write 1` (a master that lost its replica takes
//! no write), the workers with `confirm_replicas(1)` (a lock or renewal counts only once the
//! replica holds it). Replication is asynchronous, and Sentinel can leave two masters at once
//! (an old master back before it is demoted); without these a second holder gets in.

use std::time::Duration;

use lock_tests::sentinel::{RedisSentinels, SERVICE};
use lock_tests::RedisServer;

use super::{poll, poll_explained, quick_connection, LockSystem, NodeFault};

pub struct Sentinel {
    deployment: RedisSentinels,
    /// The server index (0: the first master, 1: the first replica) each fault was applied to.
    hit: Option<usize>,
}

impl Sentinel {
    pub fn start() -> Self {
        Self {
            deployment: RedisSentinels::start_min_replicas(),
            hit: None,
        }
    }

    fn server(&mut self, i: usize) -> &mut RedisServer {
        if i == 0 {
            &mut self.deployment.master
        } else {
            &mut self.deployment.replica
        }
    }

    fn port(&self, i: usize) -> u16 {
        if i == 0 {
            self.deployment.master.port()
        } else {
            self.deployment.replica.port()
        }
    }

    /// The server index the sentinels name as master (the first that answers).
    fn named_master(&self) -> Option<usize> {
        self.deployment.sentinels.iter().find_map(|s| {
            let mut con = quick_connection(s.port())?;
            let (_, port): (String, u16) = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE)
                .query(&mut con)
                .ok()?;
            (0..2).find(|i| self.port(*i) == port)
        })
    }

    /// Each server's `INFO replication` and each sentinel's master, for a failure message.
    fn replication(&self) -> String {
        let servers = (0..2).map(|i| {
            let info = quick_connection(self.port(i)).map_or_else(
                || "does not answer".to_owned(),
                |mut con| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut con)
                        .unwrap_or_else(|e| e.to_string())
                },
            );
            format!("server {i} (port {}):\n{info}", self.port(i))
        });
        let sentinels = self.deployment.sentinels.iter().map(|s| {
            let master = quick_connection(s.port()).map_or_else(
                || "does not answer".to_owned(),
                |mut con| {
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(SERVICE)
                        .query::<(String, u16)>(&mut con)
                        .map_or_else(|e| e.to_string(), |(host, port)| format!("{host}:{port}"))
                },
            );
            format!("sentinel on port {} names {master}", s.port())
        });
        servers.chain(sentinels).collect::<Vec<_>>().join("\n")
    }

    fn linked(&self, replica: usize) -> bool {
        quick_connection(self.port(replica)).is_some_and(|mut con| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut con)
                .is_ok_and(|info| info.contains("master_link_status:up"))
        })
    }
}

impl LockSystem for Sentinel {
    fn name(&self) -> &'static str {
        "sentinel: master, replica, 3 sentinels"
    }

    fn worker_args(&self) -> Vec<String> {
        let urls: Vec<String> = self.deployment.urls();
        vec![
            "--backend".into(),
            "sentinel".into(),
            "--lock-url".into(),
            urls.join(","),
            "--master".into(),
            SERVICE.into(),
            "--confirm-replicas".into(),
            "1".into(),
        ]
    }

    fn observed(&self) -> Vec<Vec<u16>> {
        vec![vec![self.port(0), self.port(1)]]
    }

    fn quorum(&self) -> usize {
        1
    }

    /// With `confirm_replicas`, waiters take the lock themselves (a hand-over inside a release
    /// would be unconfirmed).
    fn queues(&self) -> bool {
        false
    }

    /// Writers do not queue, so readers leave the read-write lock free most of the time.
    fn read_pause(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        let master = self.named_master().expect("a sentinel names the master");
        let i = if node == 0 { master } else { 1 - master };
        self.hit = Some(i);
        let server = self.server(i);
        match fault {
            NodeFault::PauseServer => server.pause(),
            NodeFault::Kill(_) => server.kill(),
            other => panic!("{other:?}: the sentinel deployment has no fault proxy"),
        }
    }

    fn heal(&mut self, _node: usize, fault: NodeFault) {
        let i = self.hit.take().expect("a fault to heal");
        match fault {
            NodeFault::PauseServer => self.server(i).resume(),
            NodeFault::Kill(restart) => {
                poll(
                    "the sentinels promoted the replica",
                    Duration::from_secs(30),
                    || self.named_master() == Some(1 - i),
                );
                let master_port = self.port(1 - i);
                let server = self.server(i);
                // Back as the replica the sentinels would make of it, from its first moment: with
                // no proxy to hold clients back, a registry reconnecting to its address could
                // otherwise lock there before MONITOR watches it (a window GUARANTEES.md names).
                server.follow_on_restart(master_port);
                super::restart_as(server, restart);
                super::until_monitored(server.port());
                // What the sentinels would tell it once they see it back, told at once.
                let () = redis::cmd("REPLICAOF")
                    .arg("127.0.0.1")
                    .arg(master_port)
                    .query(&mut server.connection())
                    .expect("REPLICAOF");
                poll_explained(
                    "the old master following the new one",
                    Duration::from_secs(30),
                    || self.linked(i),
                    || self.replication(),
                );
            }
            other => panic!("{other:?}: the sentinel deployment has no fault proxy"),
        }
    }

    fn proxy_counts(&self) -> (u64, u64) {
        (0, 0)
    }

    /// The sentinels' logs (`+sdown`, `+odown`, `+try-failover`, `+switch-master`...) and the
    /// servers': MONITOR shows no admin command, so a promotion is seen only here.
    fn logs(&self) -> Vec<(String, Vec<String>)> {
        let d = &self.deployment;
        let servers = [&d.master, &d.replica].into_iter().map(|s| ("server", s));
        let sentinels = d.sentinels.iter().map(|s| ("sentinel", s));
        servers
            .chain(sentinels)
            .map(|(kind, s)| (format!("{kind}-{}.log", s.port()), s.log()))
            .collect()
    }
}
