//! One Postgres server behind one fault proxy (the statements' and the listener's connections
//! both pass it). Its history is the holders' table's change log (see `changes`), read
//! directly; who holds a lock is asked of the tables.

use std::process::Child;
use std::time::Duration;

use lock_tests::postgres::{PostgresServer, Psql};
use lock_tests::proxy::Proxy;

use super::super::changes::{self, Change};
use super::super::checker::TTL;
use super::{poll, LockSystem, NodeFault, Recorded, Recorder, Restart};

/// The session that holds the table during [`NodeFault::HungStatement`].
const HANG: &str = "lock-tests-hang";

pub struct Postgres {
    server: PostgresServer,
    proxy: Proxy,
    /// The `psql` holding the holders' table, while a hung statement lasts.
    hang: Option<Child>,
}

impl Postgres {
    pub fn start() -> Self {
        let server = PostgresServer::start();
        let proxy = Proxy::start(server.port());
        Self {
            server,
            proxy,
            hang: None,
        }
    }

    /// `key` as a string literal.
    fn literal(key: &str) -> String {
        format!("'lock:{}'", key.replace('\'', "''"))
    }

    /// Holds the holders' table in `ACCESS EXCLUSIVE` mode from another session; returns once
    /// it is held.
    fn hang(&mut self) {
        self.hang = Some(self.server.client().spawn(
            "BEGIN; LOCK TABLE distributed_lock.holders IN ACCESS EXCLUSIVE MODE; \
             SELECT pg_sleep(600); COMMIT;",
            HANG,
        ));
        let held = format!(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = '{HANG}' AND l.granted AND l.mode = 'AccessExclusiveLock'"
        );
        poll(
            "the holders' table locked by another session",
            Duration::from_secs(10),
            || self.server.client().psql_quick(&held).as_deref() == Some("1"),
        );
    }

    /// Ends the session of [`hang`](Self::hang); its lock goes with it.
    fn unhang(&mut self) {
        self.server.psql(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{HANG}'"
        ));
        if let Some(mut child) = self.hang.take() {
            let _ = child.wait();
        }
    }
}

impl LockSystem for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn worker_args(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            "postgres".into(),
            "--lock-url".into(),
            format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                self.proxy.port()
            ),
        ]
    }

    /// No Redis server: the change log is the history.
    fn observed(&self) -> Vec<Vec<u16>> {
        Vec::new()
    }

    fn quorum(&self) -> usize {
        1
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "one server");
        match fault {
            NodeFault::Latency(d) => self.proxy.set_latency(d),
            NodeFault::Blackhole => self.proxy.blackhole(),
            NodeFault::DropReplies => self.proxy.drop_replies(),
            NodeFault::ResetConnections => self.proxy.reset_all(),
            NodeFault::PauseServer => self.server.pause(),
            NodeFault::Kill(Restart::FromDisk) => self.server.kill(),
            NodeFault::HungStatement => self.hang(),
            NodeFault::Kill(Restart::Empty) | NodeFault::MigrateSlot => {
                panic!("Postgres keeps what it committed, and has no slots: {fault:?}")
            }
        }
    }

    fn heal(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "one server");
        match fault {
            NodeFault::Latency(_) | NodeFault::Blackhole | NodeFault::DropReplies => {
                self.proxy.heal();
            }
            NodeFault::ResetConnections => {}
            NodeFault::PauseServer => self.server.resume(),
            NodeFault::Kill(_) => self.server.start_again(),
            NodeFault::HungStatement => self.unhang(),
            NodeFault::MigrateSlot => unreachable!("never injected"),
        }
    }

    fn proxy_counts(&self) -> (u64, u64) {
        let s = self.proxy.stats();
        (s.replies_dropped(), s.resets())
    }

    fn holder(&self, key: &str) -> Option<String> {
        self.server
            .client()
            .psql_quick(&format!(
                "SELECT token FROM distributed_lock.holders WHERE key = {} AND share = '' \
                 AND expires_at > clock_timestamp()",
                Self::literal(key)
            ))
            .filter(|token| !token.is_empty())
    }

    fn pttl(&self, key: &str) -> i64 {
        self.server
            .client()
            .psql_quick(&format!(
                "SELECT distributed_lock.ms(expires_at - clock_timestamp()) \
                 FROM distributed_lock.holders WHERE key = {} AND share = '' \
                 AND expires_at > clock_timestamp()",
                Self::literal(key)
            ))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(-3)
    }

    fn queued(&self, key: &str) -> Vec<String> {
        self.server
            .client()
            .psql_quick(&format!(
                "SELECT token FROM distributed_lock.waiters WHERE key = {} \
                 AND expires_at > clock_timestamp() ORDER BY arrived",
                Self::literal(key)
            ))
            .map(|tokens| tokens.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The store's schema, made before any worker's first use, with the change log's trigger
    /// on its holders' table.
    fn record(&self) -> Box<dyn Recorder> {
        self.server.psql(lock_runtime::protocol::POSTGRES_SCHEMA);
        self.server.psql(changes::CHANGE_LOG);
        Box::new(ChangeLog(self.server.client()))
    }
}

/// Reads the change log back when the run is over.
struct ChangeLog(Psql);

impl Recorder for ChangeLog {
    fn finish(self: Box<Self>) -> Recorded {
        let log = self.0.psql_separated(changes::READ, changes::SEPARATOR);
        let changes = log.lines().map(Change::parse).collect();
        // No lease reaches further than a ttl from now; one that does was given more than
        // its ttl.
        let leftover_without_ttl = self
            .0
            .psql(&format!(
                "SELECT key || ' held by ' || token || ' until ' || expires_at \
                 FROM distributed_lock.holders \
                 WHERE expires_at > clock_timestamp() + interval '{} milliseconds'",
                TTL.as_millis()
            ))
            .lines()
            .map(str::to_owned)
            .collect();
        Recorded {
            events: Vec::new(),
            changes: Some(changes),
            leftover_without_ttl,
        }
    }
}
