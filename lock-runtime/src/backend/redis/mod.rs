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

use crate::backend::contract::{Acquire, Attempt, LockInfo, Renewal, Renewed, Share, Store};
use crate::error::LockError;
use crate::key::LockKey;
use crate::names::{self, hash_tag};
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;

mod cluster_nodes;
mod coalesce;
pub(crate) mod config;
mod confirm;
mod connection;
mod errors;
mod manager;
mod native;
mod renewal;
pub(crate) mod scripts;
mod sentinel;
mod stall;
mod subscriber;

use cluster_nodes::{ClusterNodes, Following};
use coalesce::{Coalescer, Op, Order, Turn};
use config::Topology;
use confirm::{Confirmer, Route};
use connection::{Connection, SharedConnection};
use native::Native;
use renewal::{renew_chunk, Round, RENEW_CHUNK};
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
    ifeq: Native,
    /// Whether this server releases with `DELIFEQ` (in a cluster, all masters alike: one that
    /// refuses it turns it off for every key, which only costs Lua).
    delifeq: Native,
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
            ifeq: Native::default(),
            delifeq: Native::default(),
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

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// The acquire script on `con`, naming the waiters' queue when `queued` (and the fencing
    /// counter when it is needed). In a cluster slot under migration Redis refuses a script
    /// whose keys are not all on one node (`TRYAGAIN`): a caller then goes without the queue.
    async fn acquire_script(
        &self,
        con: &mut Following<'_, Connection>,
        attempt: &Acquire<'_>,
        queued: bool,
    ) -> redis::RedisResult<Vec<Value>> {
        scripts::acquire::call(attempt, queued, self.publish_command())
            .run(con)
            .await
    }

    /// Whether a release starts with `DELIFEQ`: a lock that [may be bare](Self::may_be_bare),
    /// on a server that may take it. It deletes a lock nobody waited for (its value is the bare
    /// token); anything else (marked as waited for, gone, someone else's) is refused, and the
    /// script answers.
    fn native_release(&self, may_be_bare: bool) -> bool {
        may_be_bare && self.delifeq.worth_trying()
    }

    /// Whether the lock may hold the bare token: held alone with one of our tokens, which
    /// waiters mark (an operator's `force_unlock_owned_by` may name another client's), and no
    /// waiter of this process follows it (whose attempt would have marked it: the script that
    /// hands it over is then the one command worth sending). Never a leader's: the end of a
    /// term is news for its observers, whom no mark counts, so it always goes out.
    fn may_be_bare(&self, key: &LockKey, share: Share, token: &str) -> bool {
        share == Share::Exclusive
            && self.confirm.is_none()
            && scripts::silent_when_bare(token)
            && self.hub.interested(key.channel()) == 0
    }

    /// The release script on `con`, as [`Self::acquire_script`] names keys.
    async fn release_script(
        &self,
        con: &mut Following<'_, Connection>,
        key: &LockKey,
        token: &str,
        queued: bool,
    ) -> redis::RedisResult<i64> {
        scripts::release::call(key, token, queued, self.publish_command())
            .run(con)
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
    ) -> Result<Following<'_, Connection>, LockError> {
        let con = self.connection.get(command, key).await?;
        Ok(Following::new(con, self.nodes.as_ref()))
    }

    /// Deletes the lock if `token` still holds it, without waking anyone ([`scripts::UNDO_LUA`]).
    pub(crate) async fn undo(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        every_key(join_all(key.keys().iter().map(|k| self.undo_key(k, token))).await)
    }

    /// [`Self::undo`] of one key.
    async fn undo_key(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let mut con = self.con("undo", Some(&key.name)).await?;
        let reply = scripts::undo::call(key, token)
            .run(&mut con)
            .await
            .map_err(|e| self.error("undo", Some(&key.name), e))?;
        Ok(scripts::undo::undone(reply))
    }

    /// One acquisition attempt sent on its own.
    async fn acquire_alone(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let mut con = self.con("acquire", Some(&attempt.key.name)).await?;
        if attempt.plain_set_first() {
            let set: Option<String> = scripts::acquire::plain_set(attempt)
                .query_async(&mut con)
                .await
                .map_err(|e| self.error("acquire", Some(&attempt.key.name), e))?;
            if set.is_some() {
                return Ok(Attempt::Acquired { fence: None });
            }
        }
        self.acquire_by_script(&mut con, attempt).await
    }

    /// The acquire script for `attempt`, with the waiters' queue where locks are handed over
    /// (without it where a slot is migrating).
    async fn acquire_by_script(
        &self,
        con: &mut Following<'_, Connection>,
        attempt: &Acquire<'_>,
    ) -> Result<Attempt, LockError> {
        let reply = match self.acquire_script(con, attempt, self.hands_over).await {
            Err(e) if self.hands_over && migrating(&e) => {
                self.acquire_script(con, attempt, false).await
            }
            reply => reply,
        };
        let reply = reply.map_err(|e| self.error("acquire", Some(&attempt.key.name), e))?;
        scripts::acquire::read(reply, attempt, &self.node)
    }

    /// One release sent on its own; `bare`: the lock [may be bare](Self::may_be_bare).
    async fn release_alone(
        &self,
        key: &LockKey,
        token: &str,
        bare: bool,
    ) -> Result<bool, LockError> {
        let mut con = self.con("release", Some(&key.name)).await?;
        if self.native_release(bare) {
            match scripts::release::delifeq(key, token)
                .query_async::<i64>(&mut con)
                .await
            {
                Ok(deleted) => {
                    self.delifeq.learn("DELIFEQ", Ok(()));
                    if scripts::release::released(deleted) {
                        return Ok(true);
                    }
                }
                Err(e) if self.delifeq.learn_error("DELIFEQ", &e) => {}
                Err(e) => return Err(self.error("release", Some(&key.name), e)),
            }
        }
        self.release_by_script(&mut con, key, token).await
    }

    /// The release script for `token`, as [`Self::acquire_by_script`] names keys.
    async fn release_by_script(
        &self,
        con: &mut Following<'_, Connection>,
        key: &LockKey,
        token: &str,
    ) -> Result<bool, LockError> {
        let released = match self.release_script(con, key, token, self.hands_over).await {
            Err(e) if self.hands_over && migrating(&e) => {
                self.release_script(con, key, token, false).await
            }
            released => released,
        };
        let released = released.map_err(|e| self.error("release", Some(&key.name), e))?;
        Ok(scripts::release::released(released))
    }

    /// A multi-key lock's attempt: all its keys in one script call.
    async fn acquire_all(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let mut con = self.con("acquire", Some(&attempt.key.name)).await?;
        let reply = scripts::acquire_all::call(attempt)
            .run(&mut con)
            .await
            .map_err(|e| self.error("acquire", Some(&attempt.key.name), e))?;
        scripts::acquire::read(reply, attempt, &self.node)
    }

    /// Releases one lock (a multi-key lock's keys one by one).
    async fn release_key(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> Result<bool, LockError> {
        if let Some(confirm) = &self.confirm {
            return confirm.release(key, token).await;
        }
        let bare = self.may_be_bare(key, share, token);
        let Some(coalescer) = &self.coalescer else {
            return self.release_alone(key, token, bare).await;
        };
        let native = self.native_release(bare);
        if bare {
            // `DELIFEQ`, or the batch's one call over its bare releases; refused (the lock was
            // marked as waited for), the script follows.
            let op = || match native {
                true => Op::One(scripts::release::delifeq(key, token)),
                false => Op::bare_release(&key.stored, token),
            };
            match coalescer.enter(Order::Frees(token), op) {
                Turn::Alone(_sending) => return self.release_alone(key, token, bare).await,
                Turn::Queued(reply) => match coalesce::reply(reply).await {
                    // `DELIFEQ` refused by the server (or its ACL): the script.
                    Err(e) if native && self.delifeq.learn_error("DELIFEQ", &e) => {}
                    reply => {
                        let deleted: i64 = self.read(reply, "release", &key.name)?;
                        if scripts::release::released(deleted) {
                            return Ok(true);
                        }
                    }
                },
            }
        }
        let script = || {
            let call = scripts::release::call(key, token, self.hands_over, self.publish_command());
            Op::One(call.cmd())
        };
        match coalescer.enter(Order::Frees(token), script) {
            Turn::Alone(_sending) => {
                let mut con = self.con("release", Some(&key.name)).await?;
                self.release_by_script(&mut con, key, token).await
            }
            Turn::Queued(reply) => {
                let released: i64 =
                    self.read(coalesce::reply(reply).await, "release", &key.name)?;
                Ok(scripts::release::released(released))
            }
        }
    }

    /// A batched operation's reply as `T`, or the error that names `command` and `key`.
    fn read<T: redis::FromRedisValue>(
        &self,
        reply: coalesce::Reply,
        command: &'static str,
        key: &str,
    ) -> Result<T, LockError> {
        reply
            .and_then(|v| Ok(redis::from_redis_value(v)?))
            .map_err(|e| self.error(command, Some(key), e))
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
            let (node, error) = (self.node.clone(), e.to_string());
            crate::report::tell(move || {
                tracing::debug!(node, error, "replacing the cluster client");
            });
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

    /// In a Cluster, a lock, its companions and a multi-key lock's keys share one hash slot.
    fn admit(&self, key: &LockKey) -> Result<(), LockError> {
        if self.is_cluster() {
            names::in_one_slot(key)?;
        }
        Ok(())
    }

    fn offers_fencing(&self) -> bool {
        true
    }

    /// Waiters queue up beside the lock and a release hands it straight to the oldest live
    /// one, except with `confirm_replicas`: a handoff happens inside a release, with no `WAIT`
    /// to confirm it, so its waiters take the lock themselves on the confirming connection.
    /// (Not on a Redlock node either: each node would pick its own oldest waiter, and a
    /// handoff must reach a quorum for the same waiter, so Redlock waiters wake and race.)
    fn hands_over(&self) -> bool {
        self.hands_over
    }

    /// Where waiters queue (see [`hands_over`](Self::hands_over)).
    fn stands_aside(&self) -> bool {
        self.hands_over
    }

    fn confirm_replicas(&self) -> u32 {
        self.confirm.as_ref().map_or(0, Confirmer::replicas)
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        if attempt.key.is_multi() && self.confirm.is_none() {
            return self.acquire_all(attempt).await;
        }
        if let Some(confirm) = &self.confirm {
            return confirm.acquire(attempt).await;
        }
        let Some(coalescer) = &self.coalescer else {
            return self.acquire_alone(attempt).await;
        };
        if attempt.plain_set_first() {
            match coalescer.enter(Order::Takes(attempt.token), || {
                Op::One(scripts::acquire::plain_set(attempt))
            }) {
                Turn::Alone(_sending) => return self.acquire_alone(attempt).await,
                Turn::Queued(reply) => {
                    let reply: Value =
                        self.read(coalesce::reply(reply).await, "acquire", &attempt.key.name)?;
                    if reply == Value::Okay {
                        return Ok(Attempt::Acquired { fence: None });
                    }
                    // Refused: the script says by whom, and for how long.
                }
            }
        }
        let script = || {
            let call = scripts::acquire::call(attempt, self.hands_over, self.publish_command());
            Op::One(call.cmd())
        };
        match coalescer.enter(Order::Takes(attempt.token), script) {
            Turn::Alone(_sending) => {
                let mut con = self.con("acquire", Some(&attempt.key.name)).await?;
                self.acquire_by_script(&mut con, attempt).await
            }
            Turn::Queued(reply) => {
                let reply =
                    self.read(coalesce::reply(reply).await, "acquire", &attempt.key.name)?;
                scripts::acquire::read(reply, attempt, &self.node)
            }
        }
    }

    async fn release(&self, key: &LockKey, token: &str, share: Share) -> Result<bool, LockError> {
        if !key.is_multi() {
            return self.release_key(key, token, share).await;
        }
        every_key(join_all(key.keys().iter().map(|k| self.release_key(k, token, share))).await)
    }

    async fn release_to(
        &self,
        key: &LockKey,
        token: &str,
        successor: &str,
    ) -> Result<Option<bool>, LockError> {
        if !self.hands_over {
            let released = self.release(key, token, Share::Exclusive).await?;
            return Ok(released.then_some(false));
        }
        let mut con = self.con("release", Some(&key.name)).await?;
        let publish = self.publish_command();
        match scripts::release::call_to(key, token, publish, successor)
            .run(&mut con)
            .await
        {
            Ok(reply) => Ok(scripts::release::released_to(reply)),
            // A slot in migration has no queue to pick from: a plain release.
            Err(e) if migrating(&e) => {
                let released = self.release_by_script(&mut con, key, token).await?;
                Ok(released.then_some(false))
            }
            Err(e) => Err(self.error("release", Some(&key.name), e)),
        }
    }

    /// One flag per lock: renewed, not ours, or unknown (`None`: that call failed).
    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        if let Some(confirm) = &self.confirm {
            return confirm.renew(batch, budget).await;
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
                hash_tag(&r.key.stored).unwrap_or(&r.key.stored)
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
        let mut con = self.con("inspect", Some(&key.name)).await?;
        let reply = scripts::inspect::call(key)
            .run(&mut con)
            .await
            .map_err(|e| self.error("inspect", Some(&key.name), e))?;
        Ok(scripts::inspect::read(reply))
    }

    async fn announce_taken(&self, key: &LockKey) -> Result<(), LockError> {
        let mut con = self.con("announce", Some(&key.name)).await?;
        redis::cmd(self.publish_command())
            .arg(key.channel())
            .arg(crate::backend::notification::ELECTED)
            .query_async::<i64>(&mut con)
            .await
            .map_err(|e| self.error("announce", Some(&key.name), e))?;
        Ok(())
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut con = self.con("force_unlock", Some(&key.name)).await?;
        let reply = scripts::force_unlock::call(key, self.publish_command())
            .run(&mut con)
            .await
            .map_err(|e| self.error("force_unlock", Some(&key.name), e))?;
        Ok(scripts::force_unlock::deleted(reply))
    }
}

/// Whether Redis refused a script because its slot is being migrated and not all of its keys
/// are on this node.
fn migrating(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

/// A multi-key lock's per-key answers as one: true only if every key said so, the first error
/// otherwise.
fn every_key(answers: Vec<Result<bool, LockError>>) -> Result<bool, LockError> {
    answers
        .into_iter()
        .try_fold(true, |all, one| Ok(all && one?))
}
