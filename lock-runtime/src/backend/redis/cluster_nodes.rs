//! Renewals in a Redis Cluster, sent straight to each master over a connection of its own, and
//! the cluster's redirects followed for every command.
//!
//! The cluster client funnels every request through one task, and after a master dies that
//! task can stall in its own recovery (see `stall`): while it does, no lease on any master can
//! be renewed. So the keeper's renewals go around it. Each lease is assigned to the master that
//! owns its slot in the last `CLUSTER SLOTS` answer; each master gets its script calls (one per
//! slot group, as scripts touch one slot) on its own connection, concurrently, so a dead or slow
//! master delays only its own leases. Any failed call marks the map stale: the next round reads
//! it again from whichever node answers first, which is how a failover's new master is found.
//! When no node answers at all, the caller falls back to the cluster client.
//!
//! During a slot migration the source answers `ASK` for the slot's keys it no longer has, and
//! once it is over the source answers `MOVED`. [`Following`] follows both, for renewals and for
//! the commands of the cluster client (whose own retries, which would follow them, are off; see
//! `connection`): the command goes to the named node on that node's own connection, after
//! `ASKING` in the same write for an `ASK`; a `MOVED` also marks the slot map stale. Redis
//! refuses a script whose keys are not all on one node of a migrating slot with `TRYAGAIN`: a
//! renewal then renews its keys one by one (each is on one node), an acquisition retries within
//! its `wait`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::{join_all, select_ok};
use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value,
};
use tokio::time::Instant;

use super::config::ClusterSeeds;
use super::errors::timed_out;
use super::manager::{manager, ServerConnection};
use super::native::Native;
use super::renewal::{renew_chunk, Answers, Round, RENEW_CHUNK};
use super::scripts;
use crate::backend::contract::Renewal;
use crate::io;
use crate::names::hash_tag;
use crate::timeouts::Timeouts;

/// Redis Cluster's slot count.
const SLOTS: u16 = 16384;

type Addr = (String, u16);

/// Slot ranges (first, last) and their masters, sorted by first slot.
type SlotMap = Vec<(u16, u16, Addr)>;

/// Redirects followed for one command: an `ASK`, and a `MOVED` if the migration ended meanwhile,
/// with room to spare; a longer chain is a cluster in flux, left to the callers' retries.
const MAX_REDIRECTS: usize = 3;

pub(crate) struct ClusterNodes {
    seeds: ClusterSeeds,
    timeouts: Timeouts,
    /// `None` when stale.
    map: Mutex<Option<Arc<SlotMap>>>,
    connections: Mutex<HashMap<Addr, ServerConnection>>,
    /// Per master: whether it renews exclusive locks with `SET .. IFEQ`.
    ifeq: Mutex<HashMap<Addr, Arc<Native>>>,
    reading: tokio::sync::Mutex<()>,
}

impl ClusterNodes {
    pub(crate) fn new(seeds: ClusterSeeds, timeouts: Timeouts) -> Self {
        Self {
            seeds,
            timeouts,
            map: Mutex::new(None),
            connections: Mutex::new(HashMap::new()),
            ifeq: Mutex::new(HashMap::new()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// Renews `batch` master by master, or `None` when no node told which master owns what.
    pub(crate) async fn renew(&self, batch: &[Renewal<'_>], budget: Duration) -> Option<Round> {
        let map = self.map().await?;
        let mut by_master: HashMap<&Addr, HashMap<&str, Vec<usize>>> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            let tag = hash_tag(&r.key.stored).unwrap_or(&r.key.stored);
            let slot = crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS;
            let i_range = map.partition_point(|(first, _, _)| *first <= slot);
            let Some((_, last, master)) = i_range.checked_sub(1).map(|at| &map[at]) else {
                continue;
            };
            if slot <= *last {
                by_master
                    .entry(master)
                    .or_default()
                    .entry(tag)
                    .or_default()
                    .push(i);
            }
        }
        let calls = by_master.into_iter().map(|(master, groups)| async move {
            let con = match tokio::time::timeout(budget, self.connection(master)).await {
                Ok(Ok(con)) => con,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(timed_out(budget)),
            };
            let deadline = Instant::now() + budget;
            let ifeq = self.ifeq_of(master);
            let calls = groups
                .values()
                .flat_map(|members| members.chunks(RENEW_CHUNK))
                .map(|chunk| {
                    self.renew_group(
                        Following::new(con.clone(), Some(self)),
                        batch,
                        chunk,
                        deadline,
                        &ifeq,
                    )
                });
            Ok(join_all(calls).await)
        });
        let mut round = Round::new(batch.len());
        for master in join_all(calls).await {
            match master {
                Ok(groups) => {
                    for (chunk, flags) in groups.into_iter().flatten() {
                        round.record(&chunk, flags);
                    }
                }
                Err(e) => round.fail(e),
            }
        }
        if round.incomplete() {
            // A master died, moved or failed over, or a slot had no master: read the map again.
            *self.map.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        Some(round)
    }

    /// Renews `chunk` (one slot's keys) in one round trip, or key by key when a migration has
    /// split them between two nodes (`TRYAGAIN` to the script; a fenced lock whose counter is on
    /// the other node is then renewed without keeping its counter), all by `deadline`. A lock
    /// that a migration moved answers `ASK` or `MOVED` in the pipeline (to its `SET .. IFEQ`
    /// or to the pipelined script), which does not follow it: the script, sent again as a
    /// single command, then renews it where the redirect says.
    async fn renew_group<C>(
        &self,
        mut con: Following<'_, C>,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        deadline: Instant,
        ifeq: &Native,
    ) -> Vec<(Vec<usize>, Answers)>
    where
        C: ConnectionLike + Clone + Send,
    {
        let left = || deadline.saturating_duration_since(Instant::now());
        let try_again =
            |flags: &Answers| flags.failed_with(ErrorKind::Server(ServerErrorKind::TryAgain));
        let flags = renew_chunk(&mut con, batch, chunk, left(), Some(ifeq)).await;
        if !try_again(&flags) || (chunk.len() == 1 && batch[chunk[0]].fence.is_none()) {
            return vec![(chunk.to_vec(), flags)];
        }
        let calls = chunk.iter().map(|&i| {
            let mut con = con.clone();
            async move {
                let mut flags = renew_chunk(&mut con, batch, &[i], left(), Some(ifeq)).await;
                if try_again(&flags) && batch[i].fence.is_some() {
                    // The lock and its counter are on two nodes for now: the lock alone, its
                    // counter kept at a later renewal.
                    let alone = [Renewal {
                        fence: None,
                        ..batch[i]
                    }];
                    flags = renew_chunk(&mut con, &alone, &[0], left(), Some(ifeq)).await;
                }
                (vec![i], flags)
            }
        });
        join_all(calls).await
    }

    /// Sends `cmd` where a node redirected it: for an `ASK`, after `ASKING` in the same write
    /// (the target serves an importing slot only to a command that follows `ASKING` on its
    /// connection); for a `MOVED`, as is, and the slot map is read again before the next round.
    async fn redirected(&self, to: Redirect, cmd: &Cmd) -> redis::RedisResult<Value> {
        let (addr, asking) = match to {
            Redirect::Ask(addr) => (addr, true),
            Redirect::Moved(addr) => {
                *self.map.lock().unwrap_or_else(PoisonError::into_inner) = None;
                (addr, false)
            }
        };
        let bound = self.timeouts.round();
        let send = async {
            let mut con = self.connection(&addr).await?;
            let mut reply = send(&mut con, cmd, asking).await;
            if matches!(&reply, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
            {
                // Scripts run by hash; this node has not seen ours yet.
                scripts::load_all(&mut con).await?;
                reply = send(&mut con, cmd, asking).await;
            }
            reply
        };
        tokio::time::timeout(bound, send)
            .await
            .unwrap_or_else(|_| Err(timed_out(bound)))
    }

    /// The slot map, read from the first node to answer when stale.
    async fn map(&self) -> Option<Arc<SlotMap>> {
        if let Some(map) = self.current_map() {
            return Some(map);
        }
        let _one_read = self.reading.lock().await;
        if let Some(map) = self.current_map() {
            return Some(map);
        }
        // Masters of the last map first (a failover's new master answers there), then seeds.
        let mut candidates: Vec<ConnectionInfo> = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .map(|addr| self.info(addr))
            .collect();
        candidates.extend(self.seeds.nodes.iter().cloned());
        let reads = candidates
            .into_iter()
            .map(|info| Box::pin(self.read_map(info)));
        let bound = self.timeouts.round();
        let (map, _) = tokio::time::timeout(bound, select_ok(reads))
            .await
            .ok()?
            .ok()?;
        let map = Arc::new(map);
        *self.map.lock().unwrap_or_else(PoisonError::into_inner) = Some(map.clone());
        Some(map)
    }

    fn current_map(&self) -> Option<Arc<SlotMap>> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn read_map(&self, info: ConnectionInfo) -> redis::RedisResult<SlotMap> {
        let asked = match info.addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => String::new(),
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.command));
        let client = self.client(info)?;
        let slots: Vec<Vec<Value>> = io::run(async move {
            let mut con = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut con)
                .await
        })
        .await?;
        let mut map = Vec::with_capacity(slots.len());
        for range in slots {
            let (Some(first), Some(last), Some(master)) =
                (range.first(), range.get(1), range.get(2))
            else {
                continue;
            };
            let (first, last): (u16, u16) = (
                redis::from_redis_value_ref(first)?,
                redis::from_redis_value_ref(last)?,
            );
            let (host, port): (String, u16) = match master {
                Value::Array(endpoint) if endpoint.len() >= 2 => (
                    redis::from_redis_value_ref(&endpoint[0])?,
                    redis::from_redis_value_ref(&endpoint[1])?,
                ),
                _ => continue,
            };
            // An empty or unknown endpoint means "the node you asked".
            let host = if host.is_empty() || host == "?" {
                asked.clone()
            } else {
                host
            };
            map.push((first, last, (host, port)));
        }
        map.sort_unstable_by_key(|(first, _, _)| *first);
        Ok(map)
    }

    /// This master's own connection, made on first use with the seeds' login and TLS.
    async fn connection(&self, master: &Addr) -> redis::RedisResult<ServerConnection> {
        let known = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(master)
            .cloned();
        if let Some(con) = known {
            return Ok(con);
        }
        let client = self.client(self.info(master))?;
        let con = manager(client, self.timeouts).await?;
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(master.clone(), con.clone());
        Ok(con)
    }

    /// Whether `master` renews exclusive locks with `SET .. IFEQ`, as learned so far.
    fn ifeq_of(&self, master: &Addr) -> Arc<Native> {
        self.ifeq
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(master.clone())
            .or_default()
            .clone()
    }

    /// The first seed's settings (login, database, TLS) at another node's address.
    fn info(&self, (host, port): &Addr) -> ConnectionInfo {
        let seed = self.seeds.nodes[0].clone();
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.clone(), *port),
        };
        seed.set_addr(addr)
    }

    fn client(&self, info: ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.seeds.certs {
            return redis::Client::build_with_tls(info, certs.clone());
        }
        redis::Client::open(info)
    }
}

/// `cmd` on `con`, after `ASKING` in the same write when `asking`; a server's refusal as `Err`.
async fn send(con: &mut ServerConnection, cmd: &Cmd, asking: bool) -> redis::RedisResult<Value> {
    let reply = if asking {
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(cmd.clone());
        con.req_packed_commands(&pipe, 1, 1)
            .await
            .map(|mut replies| replies.pop().unwrap_or(Value::Nil))
    } else {
        con.req_packed_command(cmd).await
    };
    reply.and_then(Value::extract_error)
}

/// Where a cluster node sent a command instead of running it.
enum Redirect {
    /// The slot is migrating and the key is (or will be) on the target: ask it this once.
    Ask(Addr),
    /// The slot is served there now.
    Moved(Addr),
}

impl Redirect {
    fn of(e: &redis::RedisError) -> Option<Self> {
        let (node, _slot) = e.redirect_node()?;
        let (host, port) = node.rsplit_once(':')?;
        if host.is_empty() {
            return None;
        }
        let addr = (host.to_owned(), port.parse().ok()?);
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::Ask) => Some(Self::Ask(addr)),
            ErrorKind::Server(ServerErrorKind::Moved) => Some(Self::Moved(addr)),
            _ => None,
        }
    }
}

/// A connection whose single commands follow a cluster's `MOVED` and `ASK` (see the module
/// docs); with no cluster (`None`), the connection as it is.
#[derive(Clone)]
pub(crate) struct Following<'n, C> {
    con: C,
    nodes: Option<&'n ClusterNodes>,
}

impl<'n, C> Following<'n, C> {
    pub(crate) fn new(con: C, nodes: Option<&'n ClusterNodes>) -> Self {
        Self { con, nodes }
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Following<'_, C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut reply = self
                .con
                .req_packed_command(cmd)
                .await
                .and_then(Value::extract_error);
            let Some(nodes) = self.nodes else {
                return reply;
            };
            for _ in 0..MAX_REDIRECTS {
                match reply.as_ref().err().and_then(Redirect::of) {
                    Some(to) => reply = nodes.redirected(to, cmd).await,
                    None => break,
                }
            }
            reply
        })
    }

    /// Pipelines go as they are: the lock operations send single commands.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.con.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }
}
