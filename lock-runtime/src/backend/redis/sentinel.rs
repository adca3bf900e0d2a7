//! Redis Sentinel: the master is whichever server the sentinels name now.
//!
//! With the `tls` feature, the sentinels are reached over TLS when their URLs are `rediss://`,
//! and the master when its URL is (a master given by name alone follows the sentinels); both
//! with the registry's certificates. The master is verified against the address the sentinels
//! announce for it, as redis-rs does.
//!
//! The registry asks the sentinels for the master of a named service (redis-rs checks the
//! answer with `ROLE`), connects to it, and runs the same commands and scripts as on a single
//! server. When the master stops answering, or answers `READONLY` because it was demoted to a
//! replica, the connection asks the sentinels again in the background and moves to the new
//! master once they have promoted one. That includes an old master back on its address as a
//! replica, which the connection may have reached again on its own: every `READONLY` asks again,
//! until the sentinels name another server. Meanwhile operations fail and are retried by their
//! callers (the acquire loop within `wait`, the keeper before each lease's deadline), exactly as
//! during a single server's outage.
//!
//! Sentinel replication is asynchronous: a lock taken on the old master just before it died may
//! not have reached the replica that replaces it. The lease keeper then finds the key gone at
//! its next renewal and reports the lease lost (`Gone`, or `Stolen` if another holder took it
//! first). No Redis lock avoids that window on a failover; fencing tokens make it harmless to
//! storage, and `confirm_replicas` (see `confirm`) closes it.
//!
//! Writes confirmed with `WAIT` go on a second connection (a `WAIT` blocks the connection it is
//! sent on), the confirming lane of the same [`SentinelConnection`]: both lanes always talk to
//! the master the sentinels named last, and a failure on either moves both.

use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::errors::unanswered;
use super::manager::{manager, ServerConnection};
use crate::report;
use crate::timeouts::Timeouts;

/// Where Sentinel mode finds its master: the sentinels, the service's name, and how to log in
/// to the master once found.
pub(crate) struct SentinelSetup {
    pub sentinels: Vec<ConnectionInfo>,
    pub service: String,
    /// Username, password and database for the master (from the master URL).
    pub master: redis::RedisConnectionInfo,
    /// Whether the master and replicas speak TLS (`None`: plain TCP).
    pub master_tls: Option<redis::TlsMode>,
    /// The certificates for a TLS master (the sentinels' own are in their addresses).
    #[cfg(feature = "tls")]
    pub certs: Option<redis::TlsCertificates>,
}

impl SentinelSetup {
    /// `sentinel <service> via host:port,..`: never credentials.
    pub(crate) fn node_name(&self) -> String {
        let sentinels = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        format!("sentinel {} via {sentinels}", self.service)
    }

    /// A client for the current master, as the first answering sentinel names it.
    pub(crate) async fn master(&self) -> redis::RedisResult<redis::Client> {
        let mut builder = SentinelClientBuilder::new(
            self.sentinels.iter().map(|s| s.addr().clone()),
            &self.service,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_db(self.master.db());
        if let Some(username) = self.master.username() {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = self.master.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(mode) = self.master_tls {
            builder = builder.set_client_to_redis_tls_mode(mode);
            #[cfg(feature = "tls")]
            if let Some(certs) = &self.certs {
                builder = builder.set_client_to_redis_certificates(certs.clone());
            }
        }
        // Sentinels of one deployment share their credentials; the first URL carries them.
        if let Some(first) = self.sentinels.first().map(ConnectionInfo::redis_settings) {
            if let Some(username) = first.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = first.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        let mut client = builder.build()?;
        // Boxed: redis-rs' lookup is a deep future, and every future that awaits a connection
        // would otherwise inline it (deep enough to overflow rustc's layout query depth).
        let lookup: futures_util::future::BoxFuture<'_, _> = Box::pin(client.async_get_client());
        lookup.await
    }
}

/// A connection to whichever server is the master, moved when the sentinels name another.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
    lane: Lane,
}

/// Which of the two connections to the current master a handle sends on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// The shared connection, for every operation.
    Shared,
    /// The connection of confirmed writes, which `WAIT` blocks (made on first use).
    Confirming,
}

struct Shared {
    setup: Arc<SentinelSetup>,
    timeouts: Timeouts,
    current: Mutex<Master>,
    /// One rediscovery at a time; failures during it do not start more.
    rediscovering: AtomicBool,
}

/// The master the sentinels named last, and the connections to it.
struct Master {
    client: redis::Client,
    addr: ConnectionAddr,
    shared: ServerConnection,
    confirming: Option<ServerConnection>,
}

impl SentinelConnection {
    pub(crate) async fn connect(
        setup: Arc<SentinelSetup>,
        timeouts: Timeouts,
    ) -> redis::RedisResult<Self> {
        let client = setup.master().await?;
        let addr = client.get_connection_info().addr().clone();
        let shared = manager(client.clone(), timeouts).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                setup,
                timeouts,
                current: Mutex::new(Master {
                    client,
                    addr,
                    shared,
                    confirming: None,
                }),
                rediscovering: AtomicBool::new(false),
            }),
            lane: Lane::Shared,
        })
    }

    /// A handle on the confirming lane: a connection of its own to the same master, which
    /// follows every move of this one.
    pub(crate) fn confirming(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            lane: Lane::Confirming,
        }
    }

    /// This lane's connection to the current master, made first if the lane has none yet.
    async fn current(&self) -> redis::RedisResult<ServerConnection> {
        let client = {
            let master = self.shared.master();
            match (self.lane, &master.confirming) {
                (Lane::Shared, _) => return Ok(master.shared.clone()),
                (Lane::Confirming, Some(con)) => return Ok(con.clone()),
                (Lane::Confirming, None) => master.client.clone(),
            }
        };
        let addr = client.get_connection_info().addr().clone();
        let con = manager(client, self.shared.timeouts).await?;
        let mut master = self.shared.master();
        // Unless the master moved meanwhile (then the new one's lane is made next time).
        if master.addr == addr && master.confirming.is_none() {
            master.confirming = Some(con.clone());
        }
        Ok(con)
    }

    /// A failure that says the master may have moved starts a rediscovery: no answer, a refused
    /// connection, or `READONLY`. redis-rs returns a server's error reply as an answer
    /// (`Value::ServerError`) and makes it an error only when the caller reads the reply, so a
    /// `READONLY` is looked for among the answers.
    fn check(&self, result: Result<&[Value], &redis::RedisError>) {
        let read_only = |kind| kind == Some(ServerErrorKind::ReadOnly);
        let moved = match result {
            Ok(answers) => answers
                .iter()
                .any(|a| matches!(a, Value::ServerError(e) if read_only(e.kind()))),
            Err(e) => {
                unanswered(e)
                    || e.is_connection_refusal()
                    || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            }
        };
        if moved {
            self.rediscover();
        }
    }

    /// Asks the sentinels again in the background, unless that is under way.
    fn rediscover(&self) {
        if !self.shared.rediscovering.swap(true, Ordering::AcqRel) {
            let shared = self.shared.clone();
            drop(crate::io::spawn(async move {
                shared.rediscover().await;
                shared.rediscovering.store(false, Ordering::Release);
            }));
        }
    }
}

impl Shared {
    fn master(&self) -> std::sync::MutexGuard<'_, Master> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the sentinels again and moves to the master they name, if it is another server.
    async fn rediscover(&self) {
        let bound = self.timeouts.connect * 2;
        let node = self.setup.node_name().to_string();
        let client = match tokio::time::timeout(bound, self.setup.master()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                report::tell(move || {
                    tracing::warn!(node, %error, "the sentinels named no reachable master");
                });
                return;
            }
            Err(_) => {
                report::tell(move || {
                    tracing::warn!(node, "the sentinels did not answer within {bound:?}");
                });
                return;
            }
        };
        let addr = client.get_connection_info().addr().clone();
        let old = self.master().addr.clone();
        if addr == old {
            // Same master: its connection managers reconnect on their own.
            return;
        }
        match tokio::time::timeout(bound, manager(client.clone(), self.timeouts)).await {
            Ok(Ok(manager)) => {
                let to = addr.to_string();
                report::tell(move || tracing::warn!(node, from = %old, to, "the master moved"));
                // The confirming lane is made anew on its next use, to the new master.
                *self.master() = Master {
                    client,
                    addr,
                    shared: manager,
                    confirming: None,
                };
            }
            Ok(Err(error)) => {
                let master = addr.to_string();
                report::tell(move || {
                    tracing::warn!(node, master, %error, "could not connect to the new master");
                });
            }
            Err(_) => {
                let master = addr.to_string();
                report::tell(move || {
                    tracing::warn!(
                        node,
                        master,
                        "could not connect to the new master within {bound:?}"
                    );
                });
            }
        }
    }
}

impl redis::aio::ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = async { self.current().await?.req_packed_command(cmd).await }.await;
            self.check(result.as_ref().map(std::slice::from_ref));
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = async {
                self.current()
                    .await?
                    .req_packed_commands(pipeline, offset, count)
                    .await
            }
            .await;
            self.check(result.as_ref().map(Vec::as_slice));
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.setup.master.db()
    }
}
