//! Redlock: one lock over N independent Redis masters.
//!
//! An acquisition sends `SET NX PX` to every node in parallel, each bounded by a timeout small
//! against the ttl, and holds only if a quorum (N/2 + 1) granted it with validity left
//! (ttl - elapsed - drift, drift = ttl/100 + 2 ms); otherwise it undoes itself on every node.
//! A renewal counts only when a quorum confirms; a partial failure never unlocks anything, and
//! the lease is lost once a quorum can no longer be kept. Releases go to every node.
//!
//! No fencing here: a counter on each node is monotonic only on that node, and independent
//! nodes cannot agree on one sequence without consensus (Kleppmann, "How to do distributed
//! locking"). Asking for fencing on Redlock is an error rather than a token that only looks
//! monotonic.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{timeout, Instant};

use super::redis::{RedisBackend, Topology};
use super::{Attempt, LockInfo, Renewal};
use crate::key::LockKey;
use crate::waiting::WaitHub;
use crate::{LockError, Timeouts};

pub(crate) struct Redlock {
    nodes: Vec<RedisBackend>,
    quorum: usize,
    name: String,
    timeouts: Timeouts,
    hub: WaitHub,
}

impl Redlock {
    pub(crate) fn new(clients: Vec<redis::Client>, timeouts: Timeouts) -> Self {
        let nodes: Vec<RedisBackend> = clients
            .into_iter()
            .map(|c| RedisBackend::new(Topology::Server(Box::new(c)), timeouts))
            .collect();
        // A release on any node wakes the waiters; each node's subscription is its own.
        let hub = WaitHub::redis(
            nodes.iter().filter_map(RedisBackend::source).collect(),
            timeouts,
        );
        let name = format!(
            "redlock({})",
            nodes
                .iter()
                .map(RedisBackend::node)
                .collect::<Vec<_>>()
                .join(",")
        );
        Self {
            quorum: nodes.len() / 2 + 1,
            nodes,
            name,
            timeouts,
            hub,
        }
    }

    pub(crate) fn node(&self) -> &str {
        &self.name
    }

    pub(crate) fn hub(&self) -> &WaitHub {
        &self.hub
    }

    /// Small against the ttl, so one slow node cannot eat the lease's validity.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10).clamp(
            Duration::from_millis(10),
            self.timeouts.command.max(Duration::from_millis(10)),
        )
    }

    fn majority_down(&self, command: &'static str, key: &LockKey, errors: &[String]) -> LockError {
        LockError::Backend {
            node: self.name.clone(),
            command,
            key: Some(key.key.clone()),
            message: format!(
                "only {} of {} nodes answered, a quorum is {}: {}",
                self.nodes.len() - errors.len(),
                self.nodes.len(),
                self.quorum,
                errors.join("; ")
            ),
            source: None,
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &str,
        ttl: Duration,
        fencing: bool,
        first: bool,
    ) -> Result<Attempt, LockError> {
        if fencing {
            return Err(LockError::InvalidOptions {
                key: key.key.clone(),
                reason: "fencing tokens are not offered on Redlock: independent nodes have no \
                         counter that increases across all of them, so any token would only look \
                         monotonic. Use a single Redis node or Redis Cluster for fencing, or drop \
                         `fencing`"
                    .to_owned(),
            });
        }
        let per_node = self.node_timeout(ttl);
        let started = Instant::now();
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(per_node, n.acquire(key, token, ttl, false, first))),
        )
        .await;
        let elapsed = started.elapsed();
        let drift = ttl / 100 + Duration::from_millis(2);
        let (mut won, mut busy, mut errors, mut refused) = (0, Vec::new(), Vec::new(), None);
        for (node, reply) in self.nodes.iter().zip(replies) {
            match reply {
                Ok(Ok(Attempt::Acquired { .. })) => won += 1,
                Ok(Ok(Attempt::Busy { retry_after })) => busy.push(retry_after),
                Ok(Err(e @ LockError::InvalidKey { .. })) => refused = Some(e),
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(_) => errors.push(format!("{}: no answer within {per_node:?}", node.node())),
            }
        }
        let valid = ttl
            .checked_sub(elapsed + drift)
            .is_some_and(|v| !v.is_zero());
        if won >= self.quorum && valid && refused.is_none() {
            return Ok(Attempt::Acquired { fence: None });
        }
        // Undo everywhere, also where no answer came: the SET may have landed anyway.
        join_all(
            self.nodes
                .iter()
                .map(|n| timeout(self.timeouts.command, n.release(key, token))),
        )
        .await;
        if let Some(e) = refused {
            return Err(e);
        }
        if won + busy.len() < self.quorum {
            return Err(self.majority_down("acquire", key, &errors));
        }
        // A quorum frees up when enough of the busy nodes' leases have run out.
        busy.sort_by_key(|left| left.unwrap_or(Duration::MAX));
        let need = self.quorum.saturating_sub(won);
        let retry_after = match need {
            // Granted but too slowly, or split between contenders: retry after a short,
            // random pause so contenders do not split again in lockstep.
            0 => Some(per_node * (getrandom::u32().unwrap_or(0) % 100 + 1) / 100),
            n => busy.get(n - 1).copied().flatten(),
        };
        Ok(Attempt::Busy { retry_after })
    }

    pub(crate) async fn release(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(self.timeouts.command, n.release(key, token))),
        )
        .await;
        let mut released = false;
        let mut errors = Vec::new();
        for (node, reply) in self.nodes.iter().zip(replies) {
            match reply {
                Ok(Ok(r)) => released |= r,
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(_) => errors.push(format!("{}: no answer", node.node())),
            }
        }
        if errors.len() == self.nodes.len() {
            return Err(self.majority_down("release", key, &errors));
        }
        Ok(released)
    }

    /// Per lock: renewed on a quorum, impossible to keep (too many nodes lost our token), or
    /// unknown (retry).
    pub(crate) async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<bool>>, LockError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(budget, n.renew(batch, budget))),
        )
        .await;
        let mut yes = vec![0usize; batch.len()];
        let mut no = vec![0usize; batch.len()];
        let mut answered = 0;
        for flags in replies.into_iter().flatten().flatten() {
            answered += 1;
            for (i, flag) in flags.into_iter().enumerate() {
                match flag {
                    Some(true) => yes[i] += 1,
                    Some(false) => no[i] += 1,
                    None => {}
                }
            }
        }
        if answered == 0 {
            return Err(LockError::Backend {
                node: self.name.clone(),
                command: "renew",
                key: None,
                message: "no node answered".to_owned(),
                source: None,
            });
        }
        let n = self.nodes.len();
        Ok(yes
            .into_iter()
            .zip(no)
            .map(|(yes, no)| {
                if yes >= self.quorum {
                    Some(true)
                } else if no > n - self.quorum {
                    Some(false)
                } else {
                    None
                }
            })
            .collect())
    }

    /// The owner that a quorum of nodes agrees on, and its shortest remaining lease there.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(self.timeouts.command, n.inspect(key))),
        )
        .await;
        let infos: Vec<LockInfo> = replies.into_iter().flatten().flatten().collect();
        if infos.len() < self.quorum {
            let missing = vec![format!(
                "{} nodes did not answer",
                self.nodes.len() - infos.len()
            )];
            return Err(self.majority_down("inspect", key, &missing));
        }
        let owner = infos
            .iter()
            .filter_map(|i| i.owner.as_deref())
            .find(|candidate| {
                infos
                    .iter()
                    .filter(|i| i.owner.as_deref() == Some(candidate))
                    .count()
                    >= self.quorum
            });
        Ok(LockInfo {
            owner: owner.map(str::to_owned),
            remaining: owner.and_then(|o| {
                infos
                    .iter()
                    .filter(|i| i.owner.as_deref() == Some(o))
                    .filter_map(|i| i.remaining)
                    .min()
            }),
            fence: None,
        })
    }

    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(self.timeouts.command, n.force_unlock(key))),
        )
        .await;
        Ok(replies
            .into_iter()
            .flatten()
            .flatten()
            .any(|deleted| deleted))
    }
}
