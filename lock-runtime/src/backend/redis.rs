//! One Redis deployment reached through one client: a standalone server, a Redis Cluster, or
//! the master a set of Sentinels names.
//!
//! Both run the same scripts. In a cluster every script touches one hash slot only (the lock,
//! its fencing counter and its sharded notification channel share the key's hash tag), MOVED/ASK
//! and failover are the cluster client's job; renewals go straight to each master (see
//! `cluster_nodes`), one script call per slot group.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionInfo, Pipeline, RedisFuture, Value};

use super::cluster_nodes::ClusterNodes;
use super::sentinel::{SentinelConnection, SentinelSetup};
use super::stall::Stall;
use super::{ttl_ms, Attempt, LockInfo, Renewal, Renewed};
use crate::io::{self, OnIo};
use crate::key::{hash_tag, LockKey};
use crate::scripts;
use crate::waiting::{Source, WaitHub};
use crate::{LockError, Timeouts};

/// Renewal scripts are split so no single script call keeps Redis busy for long.
pub(crate) const RENEW_CHUNK: usize = 512;

#[derive(Clone)]
pub(crate) enum Topology {
    Server(Box<redis::Client>),
    Cluster(ClusterSeeds),
    Sentinel(Arc<SentinelSetup>),
}

/// Where a cluster client starts, and the certificates it trusts.
#[derive(Clone)]
pub(crate) struct ClusterSeeds {
    pub nodes: Vec<ConnectionInfo>,
    #[cfg(feature = "tls")]
    pub certs: Option<redis::TlsCertificates>,
}

impl ClusterSeeds {
    pub(crate) fn builder(&self) -> redis::cluster::ClusterClientBuilder {
        let builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone());
        #[cfg(feature = "tls")]
        let builder = match &self.certs {
            Some(certs) => builder.certs(certs.clone()),
            None => builder,
        };
        builder
    }
}

pub(crate) struct RedisBackend {
    topology: Topology,
    node: String,
    timeouts: Timeouts,
    /// Shared with the task that connects, which fills it in even when every caller that
    /// waited for it has given up.
    connection: Arc<std::sync::Mutex<ConnectionSlot>>,
    /// In a cluster: renewals straight to each master.
    nodes: Option<ClusterNodes>,
    hub: WaitHub,
}

/// The shared connection once made (dropped when a cluster client is stuck or its slot map is
/// wrong), and the attempt under way to make it.
#[derive(Default)]
struct ConnectionSlot {
    ready: Option<Connection>,
    connecting: Option<Connecting>,
}

/// A connection attempt running on the I/O runtime, awaited by any number of callers.
type Connecting = Shared<BoxFuture<'static, Result<Connection, Arc<redis::RedisError>>>>;

/// The shared multiplexed connection of either kind; the scripts run on both.
#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    /// With the watch that tells when this cluster client must be replaced.
    Cluster(ClusterConnection, Arc<Stall>),
    Sentinel(SentinelConnection),
}

impl redis::aio::ConnectionLike for Connection {
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

/// How every connection manager to one server is set up: bounded connects and commands, and a
/// few quick reconnection attempts (the callers retry beyond them).
pub(crate) fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.command))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

/// A connection manager to one server with the lock scripts loaded.
pub(crate) async fn manager(
    client: redis::Client,
    timeouts: Timeouts,
) -> redis::RedisResult<ConnectionManager> {
    let mut con = ConnectionManager::new_with_config(client, manager_config(timeouts)).await?;
    // Loaded up front so no first use pays a NOSCRIPT round trip; after a SCRIPT FLUSH (or on a
    // cluster node) the invocation reloads on its own.
    let mut load = redis::pipe();
    for script in scripts::ALL {
        load.cmd("SCRIPT").arg("LOAD").arg(script);
    }
    load.query_async::<()>(&mut con).await?;
    Ok(con)
}

/// One renewal script call for `chunk` of `batch`, bounded by `budget`: a flag per lock (see
/// [`Renewed::from_flag`]).
pub(crate) async fn renew_chunk(
    con: &mut impl redis::aio::ConnectionLike,
    batch: &[Renewal<'_>],
    chunk: &[usize],
    budget: Duration,
) -> redis::RedisResult<Vec<i64>> {
    let mut call = scripts::RENEW.prepare_invoke();
    for &i in chunk {
        call.key(batch[i].redis_key)
            .arg(batch[i].token)
            .arg(batch[i].ttl_ms);
    }
    tokio::time::timeout(budget, call.invoke_async(con))
        .await
        .unwrap_or_else(|_| Err(timed_out(budget)))
}

/// Whether `e` means the server gave no answer at all (a timeout, a broken or dropped
/// connection), as opposed to an answer that refused.
pub(crate) fn unanswered(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped()
}

/// The error of a call that got no answer within `budget`.
pub(crate) fn timed_out(budget: Duration) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {budget:?}"),
    )
    .into()
}

/// One renewal round's outcome, filled in as its calls return: a flag per lock (`None`: its
/// call failed) and the last failure.
pub(crate) struct Round {
    renewed: Vec<Option<Renewed>>,
    last_error: Option<redis::RedisError>,
}

impl Round {
    pub(crate) fn new(locks: usize) -> Self {
        Self {
            renewed: vec![None; locks],
            last_error: None,
        }
    }

    pub(crate) fn record(&mut self, chunk: &[usize], flags: redis::RedisResult<Vec<i64>>) {
        match flags {
            Ok(flags) => {
                for (&i, flag) in chunk.iter().zip(flags) {
                    self.renewed[i] = Some(Renewed::from_flag(flag));
                }
            }
            Err(e) => self.fail(e),
        }
    }

    pub(crate) fn fail(&mut self, error: redis::RedisError) {
        self.last_error = Some(error);
    }

    /// Whether some lock got no answer.
    pub(crate) fn incomplete(&self) -> bool {
        self.last_error.is_some() || self.renewed.iter().any(Option::is_none)
    }

    /// The flags, or the last failure when no lock got an answer at all.
    pub(crate) fn finish(self) -> redis::RedisResult<Vec<Option<Renewed>>> {
        match self.last_error {
            Some(e) if self.renewed.iter().all(Option::is_none) => Err(e),
            _ => Ok(self.renewed),
        }
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
            // live masters' renewals included; our keeper and acquire loop retry anyway, and a
            // client whose slot map is wrong is replaced (see `RedisBackend::error`), as is one
            // that hangs in its recovery (see `stall`).
            .retries(0)
            .build()?
            .get_async_connection()
            .await
            .map(|c| Connection::Cluster(c, Arc::new(Stall::new(timeouts.command)))),
    }
}

/// `host:port[/db]`: never credentials.
pub(crate) fn node_name(info: &ConnectionInfo) -> String {
    let db = info.redis_settings().db();
    if db == 0 {
        info.addr().to_string()
    } else {
        format!("{}/{db}", info.addr())
    }
}

impl RedisBackend {
    pub(crate) fn new(topology: Topology, timeouts: Timeouts) -> Self {
        let (node, source) = match &topology {
            Topology::Server(client) => (
                node_name(client.get_connection_info()),
                Source::server(client),
            ),
            Topology::Cluster(seeds) => (
                format!(
                    "cluster({})",
                    seeds
                        .nodes
                        .iter()
                        .map(node_name)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Some(Source::Cluster(seeds.clone())),
            ),
            Topology::Sentinel(setup) => (setup.node_name(), Some(Source::Sentinel(setup.clone()))),
        };
        let hub = match source {
            Some(source) => WaitHub::redis(vec![source], timeouts),
            None => WaitHub::local(),
        };
        let nodes = match &topology {
            Topology::Cluster(seeds) => Some(ClusterNodes::new(seeds.clone(), timeouts)),
            _ => None,
        };
        Self {
            topology,
            node,
            timeouts,
            connection: Arc::default(),
            nodes,
            hub,
        }
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    pub(crate) fn hub(&self) -> &WaitHub {
        &self.hub
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// Where to subscribe for this deployment's release notifications.
    pub(crate) fn source(&self) -> Option<Source> {
        match &self.topology {
            Topology::Server(client) => Source::server(client),
            Topology::Cluster(seeds) => Some(Source::Cluster(seeds.clone())),
            Topology::Sentinel(setup) => Some(Source::Sentinel(setup.clone())),
        }
    }

    /// `SPUBLISH` keeps a cluster's notification on the shard that owns the lock.
    fn publish_command(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    fn error(&self, command: &'static str, key: Option<&str>, e: redis::RedisError) -> LockError {
        if self.is_cluster()
            && (e.is_cluster_error() || e.kind() == redis::ErrorKind::ClusterConnectionNotFound)
        {
            // The client's slot map is wrong (a cluster still forming, a failover, a migrated
            // slot) and it runs without retries of its own: the next operation builds a client
            // that reads the map afresh.
            tracing::debug!(node = %self.node, error = %e, "replacing the cluster client");
            self.slot().ready = None;
        }
        LockError::backend(&self.node, command, key, e)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, ConnectionSlot> {
        self.connection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shared connection, made on first use by a task on the I/O runtime. A caller waits
    /// for it at most the connect timeout; the attempt goes on without it, so a caller with a
    /// short budget (a Redlock node's share of a short ttl) still gets a connection next time.
    /// A failed attempt is not cached: the next operation starts another.
    async fn connection(
        &self,
        command: &'static str,
        key: Option<&str>,
    ) -> Result<OnIo<Connection>, LockError> {
        let attempt = {
            let mut slot = self.slot();
            if let Some(con) = self.usable(&mut slot) {
                return Ok(OnIo(con));
            }
            match &slot.connecting {
                Some(attempt) if attempt.peek().is_none() => attempt.clone(),
                _ => {
                    let attempt = self.start_connecting();
                    slot.connecting = Some(attempt.clone());
                    attempt
                }
            }
        };
        let failure = |message: String, source| LockError::Backend {
            node: self.node.clone(),
            command,
            key: key.map(str::to_owned),
            message,
            source,
        };
        match tokio::time::timeout(self.timeouts.connect, attempt).await {
            Ok(Ok(con)) => Ok(OnIo(con)),
            Ok(Err(e)) => Err(failure(format!("could not connect: {e}"), Some(e))),
            Err(_) => Err(failure(
                format!("could not connect within {:?}", self.timeouts.connect),
                None,
            )),
        }
    }

    fn start_connecting(&self) -> Connecting {
        let (topology, timeouts, slot) = (
            self.topology.clone(),
            self.timeouts,
            self.connection.clone(),
        );
        let task = io::spawn(async move {
            let bound = timeouts.connect.saturating_add(timeouts.command);
            let made = tokio::time::timeout(bound, connect(topology, timeouts))
                .await
                .unwrap_or_else(|_| Err(timed_out(bound)));
            if let Ok(con) = &made {
                slot.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .ready = Some(con.clone());
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

    /// The cached connection, unless it is a cluster client that answers nothing any more
    /// (see `stall`): that one is dropped so the caller connects afresh. Requests already
    /// sent on it finish or time out on their own.
    fn usable(&self, slot: &mut ConnectionSlot) -> Option<Connection> {
        if let Some(Connection::Cluster(_, stall)) = &slot.ready {
            if stall.is_stuck() {
                tracing::warn!(
                    node = %self.node,
                    "the cluster client has answered nothing for {:?}; replacing it",
                    self.timeouts.command
                );
                slot.ready = None;
            }
        }
        slot.ready.clone()
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &str,
        ttl: Duration,
        fencing: bool,
        first: bool,
    ) -> Result<Attempt, LockError> {
        let mut con = self.connection("acquire", Some(&key.key)).await?;
        if !fencing && first {
            // The uncontended case is the plain protocol command: a script call costs Redis
            // measurably more than `SET` (see the benchmark), and most acquisitions find the
            // lock free. Only a refusal needs the script's answers (whose token? how long?).
            let set: Option<String> = redis::cmd("SET")
                .arg(&key.redis_key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms(ttl))
                .query_async(&mut con)
                .await
                .map_err(|e| self.error("acquire", Some(&key.key), e))?;
            if set.is_some() {
                return Ok(Attempt::Acquired { fence: None });
            }
        }
        let reply: (i64, Value) = scripts::ACQUIRE
            .key(&key.redis_key)
            .key(&key.fence_key)
            .arg(token)
            .arg(ttl_ms(ttl))
            .arg(u8::from(fencing))
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("acquire", Some(&key.key), e))?;
        match reply {
            (1, Value::Int(fence)) => Ok(Attempt::Acquired {
                fence: fencing.then_some(u64::try_from(fence).unwrap_or(0)),
            }),
            (0, Value::Int(pttl)) => Ok(Attempt::Busy {
                retry_after: u64::try_from(pttl).ok().map(Duration::from_millis),
            }),
            (_, other) => {
                let kind = redis::from_redis_value::<String>(other).unwrap_or_default();
                Err(LockError::InvalidKey {
                    key: key.key.clone(),
                    reason: format!(
                        "Redis key `{}` on {} holds a {kind}, not a lock; it was left untouched. \
                         Pick a registry prefix or key that no application data uses",
                        crate::error::shown(&key.redis_key),
                        self.node
                    ),
                })
            }
        }
    }

    pub(crate) async fn release(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let mut con = self.connection("release", Some(&key.key)).await?;
        let deleted: i64 = scripts::RELEASE
            .key(&key.redis_key)
            .arg(token)
            .arg(self.publish_command())
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("release", Some(&key.key), e))?;
        Ok(deleted == 1)
    }

    /// One flag per lock: renewed, not ours, or unknown (`None`: that call failed).
    pub(crate) async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        if let Some(nodes) = &self.nodes {
            if let Some(round) = nodes.renew(batch, budget).await {
                return round.finish().map_err(|e| self.error("renew", None, e));
            }
        }
        let con = self.connection("renew", None).await?;
        // Scripts touch one slot each in a cluster; a standalone server takes any batch.
        let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            let group = if self.is_cluster() {
                hash_tag(r.redis_key).unwrap_or(r.redis_key)
            } else {
                ""
            };
            groups.entry(group).or_default().push(i);
        }
        let calls = groups
            .values()
            .flat_map(|members| members.chunks(RENEW_CHUNK))
            .map(|chunk| {
                let mut con = con.clone();
                async move { (chunk, renew_chunk(&mut con, batch, chunk, budget).await) }
            });
        let mut round = Round::new(batch.len());
        for (chunk, flags) in join_all(calls).await {
            round.record(chunk, flags);
        }
        round.finish().map_err(|e| self.error("renew", None, e))
    }

    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        let mut con = self.connection("inspect", Some(&key.key)).await?;
        let (owner, pttl, fence): (Option<String>, i64, Option<u64>) = scripts::INSPECT
            .key(&key.redis_key)
            .key(&key.fence_key)
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("inspect", Some(&key.key), e))?;
        Ok(LockInfo {
            owner,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence,
        })
    }

    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut con = self.connection("force_unlock", Some(&key.key)).await?;
        let deleted: i64 = scripts::FORCE_UNLOCK
            .key(&key.redis_key)
            .arg(self.publish_command())
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("force_unlock", Some(&key.key), e))?;
        Ok(deleted == 1)
    }
}
