//! The connection a deployment's operations share: made once by a task on the I/O runtime,
//! where its drivers run, awaited by every caller, and replaced when a cluster client's view
//! has gone wrong. Callers send on it from their own tasks: each kind is a channel into drivers
//! on the I/O runtime (see `manager`), so no request crosses to another thread on its own.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::config::Topology;
use super::errors::{connect_hint, store_error, timed_out};
use super::manager::{manager, ServerConnection};
use super::sentinel::SentinelConnection;
use super::stall::Stall;
use crate::error::LockError;
use crate::io;
use crate::report;
use crate::timeouts::Timeouts;

/// The multiplexed connection of any kind; the scripts run on each.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ServerConnection),
    /// With the watch that tells when this cluster client must be replaced.
    Cluster(ClusterConnection, Arc<Stall>),
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            Self::Cluster(c, stall) => stall.watch(c.req_packed_command(cmd)),
            Self::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c, stall) => stall.watch(c.req_packed_commands(pipeline, offset, count)),
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            Self::Cluster(c, _) => c.get_db(),
            Self::Sentinel(c) => c.get_db(),
        }
    }
}

/// The one connection to a deployment, made on first use.
pub(crate) struct SharedConnection {
    topology: Topology,
    node: String,
    timeouts: Timeouts,
    /// Shared with the task that connects, which fills it in even when every caller that
    /// waited for it has given up.
    slot: Arc<Mutex<Slot>>,
}

/// The connection once made (dropped when a cluster client is stuck or its slot map is
/// wrong), and the attempt under way to make it.
#[derive(Default)]
struct Slot {
    ready: Option<Connection>,
    connecting: Option<Connecting>,
}

/// A connection attempt running on the I/O runtime, awaited by any number of callers.
type Connecting = Shared<BoxFuture<'static, Result<Connection, Arc<redis::RedisError>>>>;

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    // Every update replaces one field whole: a panic elsewhere leaves nothing half-written.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SharedConnection {
    pub(crate) fn new(topology: Topology, node: String, timeouts: Timeouts) -> Self {
        Self {
            topology,
            node,
            timeouts,
            slot: Arc::default(),
        }
    }

    /// The connection, made by a task on the I/O runtime if there is none. A caller waits for
    /// it at most the connect timeout; the attempt goes on without it, so a caller with a short
    /// budget (a Redlock node's share of a short ttl) still gets a connection next time. A
    /// failed attempt is not cached: the next operation starts another.
    pub(crate) async fn get(
        &self,
        command: &'static str,
        key: Option<&str>,
    ) -> Result<Connection, LockError> {
        let (attempt, replaced) = {
            let mut slot = lock(&self.slot);
            let replaced = Self::drop_stuck(&mut slot);
            if let Some(con) = slot.ready.clone() {
                return Ok(con);
            }
            let attempt = match &slot.connecting {
                Some(attempt) if attempt.peek().is_none() => attempt.clone(),
                _ => {
                    let attempt = self.start_connecting();
                    slot.connecting = Some(attempt.clone());
                    attempt
                }
            };
            (attempt, replaced)
        };
        if replaced {
            self.tell_replaced();
        }
        let failure = |message: String, source| LockError::Backend {
            node: self.node.clone(),
            command,
            key: key.map(str::to_owned),
            message,
            source,
        };
        match tokio::time::timeout(self.timeouts.connect, attempt).await {
            Ok(Ok(con)) => Ok(con),
            Ok(Err(e)) => {
                let hint = connect_hint(&e, self.topology.tls());
                Err(failure(
                    format!("could not connect: {e}{hint}"),
                    Some(store_error((*e).clone())),
                ))
            }
            Err(_) => Err(failure(
                format!("could not connect within {:?}", self.timeouts.connect),
                None,
            )),
        }
    }

    /// Forgets the connection: the next operation makes a new one.
    pub(crate) fn reset(&self) {
        lock(&self.slot).ready = None;
    }

    fn start_connecting(&self) -> Connecting {
        let (topology, timeouts, slot) = (self.topology.clone(), self.timeouts, self.slot.clone());
        let task = io::spawn(async move {
            let bound = timeouts.round();
            let made = tokio::time::timeout(bound, connect(topology, timeouts))
                .await
                .unwrap_or_else(|_| Err(timed_out(bound)));
            if let Ok(con) = &made {
                lock(&slot).ready = Some(con.clone());
            }
            made.map_err(Arc::new)
        });
        async move {
            task.await
                .unwrap_or_else(|e| Err(Arc::new(std::io::Error::other(e.to_string()).into())))
        }
        .boxed()
        .shared()
    }

    /// Drops the cached connection if it is a cluster client that answers nothing any more
    /// (see `stall`), so the caller connects afresh; returns whether it did. Requests already
    /// sent on it finish or time out on their own.
    fn drop_stuck(slot: &mut Slot) -> bool {
        let stuck = matches!(&slot.ready, Some(Connection::Cluster(_, stall)) if stall.is_stuck());
        if stuck {
            slot.ready = None;
        }
        stuck
    }

    /// Says that a stuck cluster client was dropped: outside the slot's lock, since the
    /// application's subscriber may block.
    fn tell_replaced(&self) {
        let (node, after) = (self.node.to_string(), self.timeouts.command);
        report::tell(move || {
            tracing::warn!(
                node,
                "the cluster client has answered nothing for {after:?}; replacing it"
            );
        });
    }
}

/// Connects to `topology`; runs on the I/O runtime, so the connection's driver lives there.
async fn connect(topology: Topology, timeouts: Timeouts) -> redis::RedisResult<Connection> {
    match topology {
        Topology::Server(client) => manager(*client, timeouts).await.map(Connection::Server),
        Topology::Sentinel(setup) => SentinelConnection::connect(setup, timeouts)
            .await
            .map(Connection::Sentinel),
        Topology::Cluster(seeds) => seeds
            .builder()
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.command)
            // The client's own retries against a dead master hold up every pending request,
            // live masters' renewals included; our keeper and acquire loop retry anyway. One
            // count covers every kind of retry, so MOVED and ASK are followed around the client
            // instead (see `cluster_nodes`). A client whose slot map is wrong is replaced (see
            // `RedisBackend::error`), as is one that hangs in its recovery (see `stall`).
            .retries(0)
            .build()?
            .get_async_connection()
            .await
            .map(|c| Connection::Cluster(c, Arc::new(Stall::new(timeouts.command)))),
    }
}
