//! One Redis deployment reached through one shared connection: a standalone server, a Redis
//! Cluster, or the master a set of Sentinels names. The façade of the Redis backend: the files
//! beside it hold its parts.
//!
//! All three run the same scripts. In a cluster every script touches one hash slot only (the
//! lock, its fencing counter and its sharded notification channel share the key's hash tag);
//! failover is the cluster client's job, MOVED and ASK are followed by `cluster_nodes`, and
//! renewals go straight to each master (see `cluster_nodes`), one script call per slot group.
//!
//! With `confirm_replicas` (a server or Sentinel), acquisitions and renewals go through
//! `confirm` instead: each counts only once `WAIT` says enough replicas hold it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;

use crate::backend::contract::{
    ttl_ms, Acquire, Attempt, LockInfo, Permits, Renewal, Renewed, Share, Store,
};
use crate::key::{hash_tag, LockKey};
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;
use crate::LockError;

mod cluster_nodes;
mod coalesce;
pub(crate) mod config;
mod confirm;
mod connection;
mod errors;
mod manager;
mod renewal;
pub(crate) mod scripts;
mod sentinel;
mod stall;
mod subscriber;

use cluster_nodes::{ClusterNodes, Following};
use coalesce::{Coalescer, Op, Turn};
use config::Topology;
use confirm::{Confirmed, Confirmer, Route};
use connection::{Connection, OnIo, SharedConnection};
use renewal::{renew_chunk, IfEq, Round, RENEW_CHUNK};
use scripts::evalsha;
use subscriber::Source;

pub(crate) struct RedisBackend {
    topology: Topology,
    node: String,
    connection: Arc<SharedConnection>,
    /// In a cluster: renewals straight to each master.
    nodes: Option<ClusterNodes>,
    /// With `confirm_replicas`: acquisitions and renewals, acknowledged by replicas.
    confirm: Option<Confirmer>,
    hub: WaitHub,
    /// Whether waiters queue up and releases hand the lock straight to the oldest (see
    /// [`Self::hands_over`]).
    hands_over: bool,
    /// Concurrent acquisitions and releases, sent together (not in a cluster, where a script's
    /// keys must share one slot).
    coalescer: Option<Coalescer>,
    /// Whether this server renews exclusive locks with `SET .. IFEQ` (not in a cluster, whose
    /// masters each have their own: see `cluster_nodes`).
    ifeq: IfEq,
}

impl RedisBackend {
    /// A backend for `topology` whose waiters are fed by its own subscriber; with `replicas`
    /// above zero (a server or Sentinel), its writes count once that many replicas acknowledged
    /// them.
    pub(crate) fn new(topology: Topology, timeouts: Timeouts, replicas: u32) -> Self {
        let hub = subscriber::hub(Self::source(&topology).into_iter().collect(), timeouts);
        let mut backend = Self::with_hub(topology, timeouts, hub);
        if replicas > 0 {
            let route = match &backend.topology {
                Topology::Sentinel(_) => Route::Sentinel(backend.connection.clone()),
                other => Route::Server(SharedConnection::new(
                    other.clone(),
                    backend.node.clone(),
                    timeouts,
                )),
            };
            backend.hands_over = false;
            backend.confirm = Some(Confirmer::new(
                replicas,
                route,
                backend.node.clone(),
                timeouts,
            ));
        }
        backend
    }

    /// A Redlock node: its waiters are the Redlock's, fed by every node (see [`Self::source`]).
    pub(crate) fn redlock_node(client: redis::Client, timeouts: Timeouts) -> Self {
        let mut node = Self::with_hub(
            Topology::Server(Box::new(client)),
            timeouts,
            WaitHub::local(),
        );
        node.hands_over = false;
        node
    }

    fn with_hub(topology: Topology, timeouts: Timeouts, hub: WaitHub) -> Self {
        let node = topology.node_name();
        let nodes = match &topology {
            Topology::Cluster(seeds) => Some(ClusterNodes::new(seeds.clone(), timeouts)),
            _ => None,
        };
        let connection = Arc::new(SharedConnection::new(
            topology.clone(),
            node.clone(),
            timeouts,
        ));
        let coalescer = nodes.is_none().then(|| Coalescer::new(connection.clone()));
        Self {
            connection,
            topology,
            node,
            nodes,
            confirm: None,
            hub,
            hands_over: true,
            coalescer,
            ifeq: IfEq::default(),
        }
    }

    /// A hub fed by the subscribers of these nodes (a release on any of them wakes waiters).
    pub(crate) fn shared_hub(nodes: &[std::sync::Arc<Self>], timeouts: Timeouts) -> WaitHub {
        let sources = nodes
            .iter()
            .filter_map(|n| Self::source(&n.topology))
            .collect();
        subscriber::hub(sources, timeouts)
    }

    /// Where to subscribe for this deployment's release notifications.
    fn source(topology: &Topology) -> Option<Source> {
        match topology {
            Topology::Server(client) => Source::server(client),
            Topology::Cluster(seeds) => Some(Source::Cluster(seeds.clone())),
            Topology::Sentinel(setup) => Some(Source::Sentinel(setup.clone())),
        }
    }

    /// How many replicas must acknowledge each acquisition and renewal (0: none).
    pub(crate) fn confirm_replicas(&self) -> u32 {
        self.confirm.as_ref().map_or(0, Confirmer::replicas)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// Whether waiters queue up beside the lock and a release hands it straight to the oldest
    /// live one. Not on a Redlock node: each node would pick its own oldest waiter, and a
    /// handoff must reach a quorum for the same waiter (nodes can disagree on the order, and a
    /// waiter holding a minority would need its own undo), so Redlock waiters wake and race as
    /// before. Not with `confirm_replicas`: a handoff happens inside a release, with no `WAIT`
    /// to confirm it, so its waiters take the lock themselves on the confirming connection.
    pub(crate) fn hands_over(&self) -> bool {
        self.hands_over
    }

    /// The acquire script on `con`, naming the waiters' queue when `queued` (and the fencing
    /// counter when it is needed). In a cluster slot under migration Redis refuses a script
    /// whose keys are not all on one node (`TRYAGAIN`): a caller then goes without the queue.
    async fn acquire_script(
        &self,
        con: &mut Following<'_, OnIo<Connection>>,
        attempt: &Acquire<'_>,
        queued: bool,
    ) -> redis::RedisResult<Vec<Value>> {
        let mut call = scripts::ACQUIRE.prepare_invoke();
        for key in script_keys(attempt.key, queued, attempt.fencing) {
            call.key(key);
        }
        call.arg(attempt.token)
            .arg(ttl_ms(attempt.ttl))
            .arg(u8::from(attempt.fencing))
            .arg(u8::from(attempt.queue))
            .arg(self.publish_command())
            .arg(attempt.share.wire())
            .arg(attempt.attempt)
            .invoke_async(con)
            .await
    }

    /// An acquisition attempt's commands for a batch (never in a cluster): a plain `SET NX PX`
    /// where [`Self::acquire_alone`] starts with one, and the acquire script with the keys
    /// [`Self::acquire_script`] names.
    fn acquire_op(&self, attempt: &Acquire<'_>) -> Op {
        let key = attempt.key;
        let keys = script_keys(key, self.hands_over, attempt.fencing);
        let mut script = evalsha(&scripts::ACQUIRE, keys.len());
        script
            .arg(keys)
            .arg(attempt.token)
            .arg(ttl_ms(attempt.ttl))
            .arg(u8::from(attempt.fencing))
            .arg(u8::from(attempt.queue))
            .arg(self.publish_command())
            .arg(attempt.share.wire())
            .arg(attempt.attempt);
        if attempt.plain_set_first() {
            let mut set = redis::cmd("SET");
            set.arg(&key.redis_key)
                .arg(attempt.token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms(attempt.ttl));
            Op {
                command: set,
                if_refused: Some(script),
            }
        } else {
            Op {
                command: script,
                if_refused: None,
            }
        }
    }

    /// A release's command for a batch (never in a cluster), with the keys
    /// [`Self::release_script`] names.
    fn release_op(&self, key: &LockKey, token: &str) -> Op {
        let keys = script_keys(key, self.hands_over, false);
        let mut script = evalsha(&scripts::RELEASE, keys.len());
        script.arg(keys).arg(token).arg(self.publish_command());
        Op {
            command: script,
            if_refused: None,
        }
    }

    /// The release script on `con`, as [`Self::acquire_script`] names keys.
    async fn release_script(
        &self,
        con: &mut Following<'_, OnIo<Connection>>,
        key: &LockKey,
        token: &str,
        queued: bool,
    ) -> redis::RedisResult<i64> {
        let mut call = scripts::RELEASE.prepare_invoke();
        for key in script_keys(key, queued, false) {
            call.key(key);
        }
        call.arg(token)
            .arg(self.publish_command())
            .invoke_async(con)
            .await
    }

    /// `SPUBLISH` keeps a cluster's notification on the shard that owns the lock.
    fn publish_command(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// The shared connection for one operation; in a cluster it follows MOVED and ASK.
    async fn con(
        &self,
        command: &'static str,
        key: Option<&str>,
    ) -> Result<Following<'_, OnIo<Connection>>, LockError> {
        let con = self.connection.get(command, key).await?;
        Ok(Following::new(con, self.nodes.as_ref()))
    }

    /// Deletes the lock if `token` still holds it, without waking anyone ([`scripts::UNDO_LUA`]).
    pub(crate) async fn undo(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        every_key(join_all(key.keys().iter().map(|k| self.undo_key(k, token))).await)
    }

    /// [`Self::undo`] of one key.
    async fn undo_key(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let mut con = self.con("undo", Some(&key.key)).await?;
        let deleted: i64 = scripts::UNDO
            .key(&key.redis_key)
            .arg(token)
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("undo", Some(&key.key), e))?;
        Ok(deleted == 1)
    }

    /// An acquisition on the confirming connection: the acquire script, then `WAIT`. A lock
    /// taken but not acknowledged by enough replicas is released (before the caller may retry
    /// with the same token) and the attempt fails, so the acquire loop retries within `wait`.
    async fn acquire_confirmed(
        &self,
        confirm: &Confirmer,
        attempt: &Acquire<'_>,
    ) -> Result<Attempt, LockError> {
        let mut cmd;
        if attempt.key.all.is_empty() {
            cmd = evalsha(&scripts::ACQUIRE, 2);
            cmd.arg(&attempt.key.redis_key)
                .arg(&attempt.key.fence_key)
                .arg(attempt.token)
                .arg(ttl_ms(attempt.ttl))
                .arg(u8::from(attempt.fencing))
                .arg(0u8)
                .arg(self.publish_command())
                .arg(attempt.share.wire());
        } else {
            let keys = attempt.key.keys();
            let names = all_keys(attempt);
            cmd = evalsha(&scripts::ACQUIRE_ALL, names.len());
            cmd.arg(names)
                .arg(attempt.token)
                .arg(ttl_ms(attempt.ttl))
                .arg(u8::from(attempt.fencing))
                .arg(keys.len());
        }
        // Small against the ttl: the lease's deadline runs from before the acquisition was sent.
        let wait = attempt.ttl / 20;
        let confirmed = confirm
            .send(cmd, Some(wait), "acquire", Some(&attempt.key.key))
            .await?;
        let reply = confirmed
            .reply
            .clone()
            .extract_error()
            .and_then(|v| Ok(redis::from_redis_value::<Vec<Value>>(v)?))
            .map_err(|e| self.error("acquire", Some(&attempt.key.key), e))?;
        let outcome = self.attempt(attempt, reply)?;
        if matches!(outcome, Attempt::Acquired { .. }) && !confirmed.by(confirm.replicas()) {
            return Err(self
                .unconfirmed_acquisition(confirm, attempt, &confirmed)
                .await);
        }
        Ok(outcome)
    }

    /// A release on the confirming connection, with no `WAIT` of its own: behind every
    /// acquisition sent there before it, so a release that lets go of a cancelled acquisition
    /// can never reach the server ahead of the acquisition itself.
    async fn release_confirmed(
        &self,
        confirm: &Confirmer,
        key: &LockKey,
        token: &str,
    ) -> Result<bool, LockError> {
        let keys = script_keys(key, false, false);
        let mut cmd = evalsha(&scripts::RELEASE, keys.len());
        cmd.arg(keys).arg(token).arg(self.publish_command());
        let confirmed = confirm.send(cmd, None, "release", Some(&key.key)).await?;
        let released = confirmed
            .reply
            .extract_error()
            .and_then(|v| Ok(redis::from_redis_value::<i64>(v)?))
            .map_err(|e| self.error("release", Some(&key.key), e))?;
        Ok(released > 0)
    }

    /// Releases a lock that enough replicas did not acknowledge, and says so.
    async fn unconfirmed_acquisition(
        &self,
        confirm: &Confirmer,
        attempt: &Acquire<'_>,
        confirmed: &Confirmed,
    ) -> LockError {
        let released = match self.release(attempt.key, attempt.token).await {
            Ok(_) => "it was released".to_owned(),
            Err(e) => format!("releasing it failed too ({e}), so it expires within its ttl"),
        };
        LockError::Backend {
            node: self.node.clone(),
            command: "acquire",
            key: Some(attempt.key.key.clone()),
            message: format!(
                "took the lock, but {} (`confirm_replicas`), and a failover could hand an \
                 unacknowledged lock to a second holder: {released}. Check that the master has \
                 at least {} connected replica(s) in sync (`INFO replication`), or lower \
                 `confirm_replicas`",
                confirmed.describe(confirm.replicas()),
                confirm.replicas()
            ),
            source: None,
        }
    }

    /// A renewal round on the confirming connection: one script call per chunk, each followed
    /// by `WAIT`. Always the script, also where the server has `SET .. IFEQ`: the confirming
    /// connection batches whole writes (at most 64 before each `WAIT`), so a chunk must stay
    /// one command. A lock renewed but not acknowledged by enough replicas is neither renewed nor
    /// lost (`None`): the keeper retries, and the lease runs out at its deadline if no renewal
    /// is ever confirmed. Nothing is deleted.
    async fn renew_confirmed(
        &self,
        confirm: &Confirmer,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        let chunks: Vec<Vec<usize>> = (0..batch.len())
            .collect::<Vec<_>>()
            .chunks(RENEW_CHUNK)
            .map(<[usize]>::to_vec)
            .collect();
        let calls = chunks.iter().map(|chunk| async move {
            let mut cmd = evalsha(&scripts::RENEW, chunk.len());
            for &i in chunk {
                cmd.arg(batch[i].redis_key);
            }
            for &i in chunk {
                cmd.arg(batch[i].token).arg(batch[i].ttl_ms);
            }
            let sent =
                tokio::time::timeout(budget, confirm.send(cmd, Some(budget / 2), "renew", None));
            (chunk, sent.await)
        });
        let mut round = Round::new(batch.len());
        for (chunk, sent) in join_all(calls).await {
            let confirmed = match sent {
                Ok(Ok(confirmed)) => confirmed,
                Ok(Err(e)) => {
                    round.fail(errors::redis_error(&e));
                    continue;
                }
                Err(_) => {
                    round.fail(errors::timed_out(budget));
                    continue;
                }
            };
            let flags = confirmed
                .reply
                .clone()
                .extract_error()
                .and_then(|v| Ok(redis::from_redis_value::<Vec<i64>>(v)?));
            if confirmed.by(confirm.replicas()) {
                round.record(chunk, flags.into());
            } else {
                let why = format!(
                    "renewed on {}, but {} (`confirm_replicas`), so not counted: the leases run \
                     out at their deadlines unless a renewal is acknowledged before",
                    self.node,
                    confirmed.describe(confirm.replicas()),
                );
                round.record_unconfirmed(chunk, flags, why);
            }
        }
        round.finish().map_err(|e| self.error("renew", None, e))
    }

    /// One acquisition attempt sent on its own.
    async fn acquire_alone(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let mut con = self.con("acquire", Some(&attempt.key.key)).await?;
        if attempt.plain_set_first() {
            // The uncontended case is the plain protocol command: a script call costs Redis
            // measurably more than `SET` (see the benchmark), and most acquisitions find the
            // lock free. Only a refusal needs the script's answers (whose token? how long?).
            let set: Option<String> = redis::cmd("SET")
                .arg(&attempt.key.redis_key)
                .arg(attempt.token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms(attempt.ttl))
                .query_async(&mut con)
                .await
                .map_err(|e| self.error("acquire", Some(&attempt.key.key), e))?;
            if set.is_some() {
                return Ok(Attempt::Acquired { fence: None });
            }
        }
        let reply = match self
            .acquire_script(&mut con, attempt, self.hands_over)
            .await
        {
            Err(e) if self.hands_over && migrating(&e) => {
                self.acquire_script(&mut con, attempt, false).await
            }
            reply => reply,
        };
        let reply = reply.map_err(|e| self.error("acquire", Some(&attempt.key.key), e))?;
        self.attempt(attempt, reply)
    }

    /// One release sent on its own.
    async fn release_alone(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let mut con = self.con("release", Some(&key.key)).await?;
        let released = match self
            .release_script(&mut con, key, token, self.hands_over)
            .await
        {
            Err(e) if self.hands_over && migrating(&e) => {
                self.release_script(&mut con, key, token, false).await
            }
            released => released,
        };
        let released = released.map_err(|e| self.error("release", Some(&key.key), e))?;
        Ok(released > 0)
    }

    /// The acquire script's reply, read.
    fn attempt(&self, attempt: &Acquire<'_>, reply: Vec<Value>) -> Result<Attempt, LockError> {
        match reply.as_slice() {
            [Value::Int(1), Value::Int(fence)] => Ok(Attempt::Acquired {
                fence: attempt
                    .fencing
                    .then_some(u64::try_from(*fence).unwrap_or(0)),
            }),
            [Value::Int(0), Value::Int(pttl), owner @ ..] => Ok(Attempt::Busy {
                retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
                holder: owner
                    .first()
                    .and_then(|o| redis::from_redis_value_ref::<String>(o).ok()),
                at: match owner.get(1) {
                    Some(Value::Int(i)) => key_index(*i),
                    _ => 0,
                },
            }),
            [Value::Int(3), found] => {
                let found = redis::from_redis_value_ref::<String>(found).unwrap_or_default();
                Err(match Share::from_tag(&found) {
                    Some(found) => attempt.share.mismatch(&attempt.key.key, &self.node, found),
                    None => self.not_a_lock(attempt.key, "sorted set"),
                })
            }
            other => {
                let kind = other
                    .get(1)
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    .unwrap_or_default();
                let at = match other.get(2) {
                    Some(Value::Int(i)) => key_index(*i),
                    _ => 0,
                };
                let keys = attempt.key.keys();
                Err(self.not_a_lock(keys.get(at).unwrap_or(attempt.key), &kind))
            }
        }
    }

    /// A multi-key lock's attempt: all its keys in one script call.
    async fn acquire_all(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let mut con = self.con("acquire", Some(&attempt.key.key)).await?;
        let mut call = scripts::ACQUIRE_ALL.prepare_invoke();
        for name in all_keys(attempt) {
            call.key(name);
        }
        let reply: Vec<Value> = call
            .arg(attempt.token)
            .arg(ttl_ms(attempt.ttl))
            .arg(u8::from(attempt.fencing))
            .arg(attempt.key.keys().len())
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("acquire", Some(&attempt.key.key), e))?;
        self.attempt(attempt, reply)
    }

    /// Releases one lock (a multi-key lock's keys one by one).
    async fn release_key(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        if let Some(confirm) = &self.confirm {
            return self.release_confirmed(confirm, key, token).await;
        }
        let Some(coalescer) = &self.coalescer else {
            return self.release_alone(key, token).await;
        };
        match coalescer.enter(|| self.release_op(key, token)) {
            Turn::Alone(_sending) => self.release_alone(key, token).await,
            Turn::Queued(reply) => {
                let released = coalesce::reply(reply)
                    .await
                    .and_then(|v| Ok(redis::from_redis_value::<i64>(v)?))
                    .map_err(|e| self.error("release", Some(&key.key), e))?;
                Ok(released > 0)
            }
        }
    }

    /// The key holds application data (`kind`), which is left untouched.
    fn not_a_lock(&self, key: &LockKey, kind: &str) -> LockError {
        LockError::InvalidKey {
            key: key.key.clone(),
            reason: format!(
                "Redis key `{}` on {} holds a {kind}, not a lock; it was left untouched. Pick a \
                 registry prefix or key that no application data uses",
                crate::error::shown(&key.redis_key),
                self.node
            ),
        }
    }

    fn error(&self, command: &'static str, key: Option<&str>, e: redis::RedisError) -> LockError {
        if self.is_cluster()
            && !migrating(&e)
            && !matches!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::Ask)
            )
            && (e.is_cluster_error() || e.kind() == redis::ErrorKind::ClusterConnectionNotFound)
        {
            // The client's slot map is wrong (a cluster still forming, a failover) and it runs
            // without retries of its own: the next operation builds a client that reads the
            // map afresh. A migration's refusals say nothing against the map.
            tracing::debug!(node = %self.node, error = %e, "replacing the cluster client");
            self.connection.reset();
        }
        errors::lock_error(&self.node, command, key, e)
    }
}

impl Store for RedisBackend {
    fn node(&self) -> &str {
        &self.node
    }

    fn hub(&self) -> &WaitHub {
        &self.hub
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        if !attempt.key.all.is_empty() && self.confirm.is_none() {
            return self.acquire_all(attempt).await;
        }
        if let Some(confirm) = &self.confirm {
            return self.acquire_confirmed(confirm, attempt).await;
        }
        let Some(coalescer) = &self.coalescer else {
            return self.acquire_alone(attempt).await;
        };
        match coalescer.enter(|| self.acquire_op(attempt)) {
            Turn::Alone(_sending) => self.acquire_alone(attempt).await,
            Turn::Queued(reply) => {
                let reply = coalesce::reply(reply)
                    .await
                    .map_err(|e| self.error("acquire", Some(&attempt.key.key), e))?;
                if reply == Value::Okay {
                    // The plain `SET NX PX` took it.
                    return Ok(Attempt::Acquired { fence: None });
                }
                let reply = redis::from_redis_value::<Vec<Value>>(reply)
                    .map_err(|e| self.error("acquire", Some(&attempt.key.key), e.into()))?;
                self.attempt(attempt, reply)
            }
        }
    }

    async fn release(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        if key.all.is_empty() {
            return self.release_key(key, token).await;
        }
        every_key(join_all(key.all.iter().map(|k| self.release_key(k, token))).await)
    }

    /// One flag per lock: renewed, not ours, or unknown (`None`: that call failed).
    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        if let Some(confirm) = &self.confirm {
            return self.renew_confirmed(confirm, batch, budget).await;
        }
        if let Some(nodes) = &self.nodes {
            if let Some(round) = nodes.renew(batch, budget).await {
                return round.finish().map_err(|e| self.error("renew", None, e));
            }
        }
        let con = self.con("renew", None).await?;
        // Through the cluster client (no master answered `CLUSTER SLOTS`) renewals stay with
        // the script: a pipeline there would not follow redirects.
        let ifeq = (!self.is_cluster()).then_some(&self.ifeq);
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
                async move {
                    (
                        chunk,
                        renew_chunk(&mut con, batch, chunk, budget, ifeq).await,
                    )
                }
            });
        let mut round = Round::new(batch.len());
        for (chunk, flags) in join_all(calls).await {
            round.record(chunk, flags);
        }
        round.finish().map_err(|e| self.error("renew", None, e))
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        let mut con = self.con("inspect", Some(&key.key)).await?;
        type Found = (
            Option<String>,
            i64,
            Option<u64>,
            Option<u32>,
            Option<String>,
        );
        let (owner, pttl, fence, held, tag): Found = scripts::INSPECT
            .key(&key.redis_key)
            .key(&key.fence_key)
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("inspect", Some(&key.key), e))?;
        // A set whose every place ran out is free, though its key has not expired yet.
        let shared = held
            .filter(|held| *held > 0)
            .zip(tag.as_deref().and_then(Share::from_tag));
        Ok(LockInfo {
            owner,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence,
            permits: match shared {
                Some((held, Share::Permits(total))) => Some(Permits { held, total }),
                _ => None,
            },
            readers: match shared {
                Some((held, Share::Read)) => Some(held),
                _ => None,
            },
        })
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut con = self.con("force_unlock", Some(&key.key)).await?;
        let deleted: i64 = scripts::FORCE_UNLOCK
            .key(&key.redis_key)
            .arg(self.publish_command())
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.error("force_unlock", Some(&key.key), e))?;
        Ok(deleted == 1)
    }
}

/// Whether Redis refused a script because its slot is being migrated and not all of its keys
/// are on this node.
/// A script's 1-based key number, as an index.
fn key_index(i: i64) -> usize {
    usize::try_from(i - 1).unwrap_or(0)
}

fn migrating(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

/// The keys [`scripts::ACQUIRE_ALL_LUA`] names: every lock, then with fencing their counters.
fn all_keys<'a>(attempt: &Acquire<'a>) -> Vec<&'a str> {
    let keys = attempt.key.keys();
    let locks = keys.iter().map(|k| k.redis_key.as_str());
    let fences = keys.iter().map(|k| k.fence_key.as_str());
    if attempt.fencing {
        locks.chain(fences).collect()
    } else {
        locks.collect()
    }
}

/// A multi-key lock's per-key answers as one: true only if every key said so, the first error
/// otherwise.
fn every_key(answers: Vec<Result<bool, LockError>>) -> Result<bool, LockError> {
    answers
        .into_iter()
        .try_fold(true, |all, one| Ok(all && one?))
}

/// The keys the acquire and release scripts name: the lock, then with `queued` its fencing
/// counter and waiters' queue, else the counter only when `fencing` (during a slot migration
/// Redis refuses a script whose keys are not all on one node, and a lock without fencing may
/// have no counter at all).
fn script_keys(key: &LockKey, queued: bool, fencing: bool) -> Vec<&str> {
    if queued {
        vec![
            &key.redis_key,
            &key.fence_key,
            &key.queue_key,
            &key.queued_key,
        ]
    } else if fencing {
        vec![&key.redis_key, &key.fence_key]
    } else {
        vec![&key.redis_key]
    }
}
