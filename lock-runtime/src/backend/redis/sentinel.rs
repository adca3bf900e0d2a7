//! Redis Sentinel: the master is whichever server the sentinels name now.
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
//! storage.

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::errors::unanswered;
use super::manager::manager;
use crate::timeouts::Timeouts;

/// Where Sentinel mode finds its master: the sentinels, the service's name, and how to log in
/// to the master once found.
pub(crate) struct SentinelSetup {
    pub sentinels: Vec<ConnectionInfo>,
    pub service: String,
    /// Username, password and database for the master (from the master URL).
    pub master: redis::RedisConnectionInfo,
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
}

struct Shared {
    setup: Arc<SentinelSetup>,
    timeouts: Timeouts,
    current: Mutex<(ConnectionManager, ConnectionAddr)>,
    /// One rediscovery at a time; failures during it do not start more.
    rediscovering: AtomicBool,
}

impl SentinelConnection {
    pub(crate) async fn connect(
        setup: Arc<SentinelSetup>,
        timeouts: Timeouts,
    ) -> redis::RedisResult<Self> {
        let client = setup.master().await?;
        let addr = client.get_connection_info().addr().clone();
        let manager = manager(client, timeouts).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                setup,
                timeouts,
                current: Mutex::new((manager, addr)),
                rediscovering: AtomicBool::new(false),
            }),
        })
    }

    fn current(&self) -> ConnectionManager {
        self.shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    /// `reply`, whose failure may start a rediscovery; `answers` are its server replies.
    fn checked<'a, T: Send + 'a>(
        &'a self,
        reply: impl std::future::Future<Output = redis::RedisResult<T>> + Send + 'a,
        answers: fn(&T) -> &[Value],
    ) -> RedisFuture<'a, T> {
        Box::pin(async move {
            let result = reply.await;
            self.check(result.as_ref().map(answers));
            result
        })
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
        if moved && !self.shared.rediscovering.swap(true, Ordering::AcqRel) {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                shared.rediscover().await;
                shared.rediscovering.store(false, Ordering::Release);
            });
        }
    }
}

impl Shared {
    /// Asks the sentinels again and moves to the master they name, if it is another server.
    async fn rediscover(&self) {
        let bound = self.timeouts.connect * 2;
        let client = match tokio::time::timeout(bound, self.setup.master()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                tracing::warn!(node = %self.setup.node_name(), %error, "the sentinels named no reachable master");
                return;
            }
            Err(_) => {
                tracing::warn!(node = %self.setup.node_name(), "the sentinels did not answer within {bound:?}");
                return;
            }
        };
        let addr = client.get_connection_info().addr().clone();
        let old = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone();
        if addr == old {
            // Same master: its connection manager reconnects on its own.
            return;
        }
        match tokio::time::timeout(bound, manager(client, self.timeouts)).await {
            Ok(Ok(manager)) => {
                tracing::warn!(node = %self.setup.node_name(), from = %old, to = %addr, "the master moved");
                *self.current.lock().unwrap_or_else(PoisonError::into_inner) = (manager, addr);
            }
            Ok(Err(error)) => {
                tracing::warn!(node = %self.setup.node_name(), master = %addr, %error, "could not connect to the new master");
            }
            Err(_) => {
                tracing::warn!(node = %self.setup.node_name(), master = %addr, "could not connect to the new master within {bound:?}");
            }
        }
    }
}

impl redis::aio::ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut con = self.current();
        self.checked(
            async move { con.req_packed_command(cmd).await },
            std::slice::from_ref,
        )
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut con = self.current();
        self.checked(
            async move { con.req_packed_commands(pipeline, offset, count).await },
            Vec::as_slice,
        )
    }

    fn get_db(&self) -> i64 {
        self.shared.setup.master.db()
    }
}
