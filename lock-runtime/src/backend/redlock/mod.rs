//! Redlock: one lock over N independent Redis masters.
//!
//! An acquisition sends `SET NX PX` to every node in parallel, each bounded by a timeout small
//! against the ttl, and holds only if a quorum (N/2 + 1) granted it with validity left
//! (ttl - elapsed - drift, drift = ttl/100 + 2 ms); otherwise it undoes itself on every node
//! (silently, unless it had won a quorum: nobody can be waiting for a minority to end).
//! A refused attempt waits for a release notification while one holder keeps a quorum, and
//! otherwise (contenders split the vote) retries after a short random pause. Each attempt has
//! a token of its own, so a late undo can never delete what a later attempt won. Attempts
//! and releases of one registry take [`turns`], so they never split the vote among themselves.
//! A renewal counts only when a quorum confirms; a partial failure never unlocks anything, and
//! the lease is lost once a quorum can no longer be kept. Releases go to every node.
//!
//! No fencing here: a counter on each node is monotonic only on that node, and independent
//! nodes cannot agree on one sequence without consensus (Kleppmann, "How to do distributed
//! locking"). Asking for fencing on Redlock is an error rather than a token that only looks
//! monotonic.

mod turns;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{watch, Notify};
use tokio::time::{timeout, Instant};

use super::contract::{Acquire, Attempt, LockInfo, Permits, Place, Renewal, Renewed, Share, Store};
use super::redis::RedisBackend;
use crate::key::LockKey;
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;
use crate::{error::LockError, io};
use turns::Turns;

pub(crate) struct Redlock {
    nodes: Vec<Arc<RedisBackend>>,
    quorum: usize,
    name: String,
    timeouts: Timeouts,
    hub: WaitHub,
    on_the_way: Arc<OnTheWay>,
    turns: Turns,
}

/// The attempts still on their way to their nodes, by token: a release of that token waits,
/// on each node, for the attempt there to come back, so it can never reach the node first and
/// leave the attempt's lock behind.
#[derive(Default)]
struct OnTheWay(Mutex<HashMap<String, Arc<Attempts>>>);

/// One token's attempt on each node.
struct Attempts {
    landed: Vec<(AtomicBool, Notify)>,
    /// Nodes whose attempt has not come back yet; the last one takes the entry out.
    left: AtomicUsize,
}

impl OnTheWay {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Attempts>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sent(&self, token: &str, nodes: usize) {
        let attempts = Attempts {
            landed: (0..nodes)
                .map(|_| (AtomicBool::new(false), Notify::new()))
                .collect(),
            left: AtomicUsize::new(nodes),
        };
        self.map().insert(token.to_owned(), Arc::new(attempts));
    }

    /// The attempt with `token` on node `i` came back (with any outcome).
    fn landed(&self, token: &str, i: usize) {
        let attempts = self.map().get(token).cloned();
        if let Some(attempts) = attempts {
            let (landed, notify) = &attempts.landed[i];
            landed.store(true, Ordering::Release);
            notify.notify_waiters();
            if attempts.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.map().remove(token);
            }
        }
    }

    /// Returns once the attempt with `token` on node `i` came back, if one is on its way.
    async fn arrived(&self, token: &str, i: usize) {
        let Some(attempts) = self.map().get(token).cloned() else {
            return;
        };
        let (landed, notify) = &attempts.landed[i];
        loop {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if landed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// One node's reply, or why there was none.
type Reply<T> = Result<T, LockError>;

/// What an acquisition decided, for the task that sent its attempt to each node.
#[derive(Clone, Debug)]
enum Verdict {
    Pending,
    /// The lock is held: every node keeps its grant, also one that came too late to be counted
    /// (renewals and the release reach every node).
    Keep,
    /// Nothing is held: every node takes its grant back, waking waiters if `announce` (the
    /// attempt held a quorum, too late: someone may have waited for it).
    Undo {
        announce: bool,
    },
}

impl Redlock {
    pub(crate) fn new(clients: Vec<redis::Client>, timeouts: Timeouts) -> Self {
        let nodes: Vec<Arc<RedisBackend>> = clients
            .into_iter()
            .map(|c| Arc::new(RedisBackend::redlock_node(c, timeouts)))
            .collect();
        // A release on any node wakes the waiters; each node's subscription is its own.
        let hub = RedisBackend::shared_hub(&nodes, timeouts);
        let name = format!(
            "redlock({})",
            nodes.iter().map(|n| n.node()).collect::<Vec<_>>().join(",")
        );
        Self {
            quorum: nodes.len() / 2 + 1,
            nodes,
            name,
            timeouts,
            hub,
            on_the_way: Arc::default(),
            turns: Turns::default(),
        }
    }

    /// Small against the ttl, so one slow node cannot eat the lease's validity.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10).clamp(
            Duration::from_millis(10),
            self.timeouts.command.max(Duration::from_millis(10)),
        )
    }

    /// Sends `op` to every node at once and yields the replies as they arrive (each bounded by
    /// `per_node`). Each node's operation runs as a task on the I/O runtime, so a caller that
    /// stops reading once the outcome is decided never holds the others up, and a straggler's
    /// command is still sent and its reply read.
    fn fan_out<T, F, Fut>(
        &self,
        per_node: Duration,
        op: F,
    ) -> FuturesUnordered<impl Future<Output = Reply<T>>>
    where
        T: Send + 'static,
        F: Fn(usize, Arc<RedisBackend>) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let name = node.node().to_owned();
                let task = io::spawn(op(i, node.clone()));
                async move {
                    let silent = |message: String| LockError::Backend {
                        node: name.clone(),
                        command: "redlock",
                        key: None,
                        message,
                        source: None,
                    };
                    match timeout(per_node, task).await {
                        Ok(Ok(reply)) => reply,
                        Ok(Err(e)) => Err(silent(e.to_string())),
                        Err(_) => Err(silent(format!("no answer within {per_node:?}"))),
                    }
                }
            })
            .collect()
    }

    fn majority_down(&self, command: &'static str, key: &LockKey, errors: &[String]) -> LockError {
        self.too_few(command, key, errors, self.quorum)
    }

    /// Fewer than `quorum` nodes answered.
    fn too_few(
        &self,
        command: &'static str,
        key: &LockKey,
        errors: &[String],
        quorum: usize,
    ) -> LockError {
        let more = if quorum > self.quorum {
            " (a semaphore's permit needs more nodes than a lock: see `LockOptions::permits`)"
        } else {
            ""
        };
        LockError::Backend {
            node: self.name.clone(),
            command,
            key: Some(key.name.clone()),
            message: format!(
                "only {} of {} nodes answered, a quorum is {quorum}{more}: {}",
                self.nodes.len() - errors.len(),
                self.nodes.len(),
                errors.join("; ")
            ),
            source: None,
        }
    }

    /// Sends `attempt` to every node at once, each as a task on the I/O runtime, and yields each
    /// node's reply (or why there was none within `per_node`) as it arrives. Each task then
    /// waits for the [`Verdict`] and takes its node's grant back unless the acquisition kept
    /// it: after its own attempt came back, so the undo can never reach the node ahead of the
    /// attempt (queued behind other commands there) and leave a lock nobody owns. A task whose
    /// acquisition is dropped undecided undoes too. A release waits likewise (see
    /// [`OnTheWay`]).
    fn attempt_on_every_node(
        &self,
        attempt: &Acquire<'_>,
        per_node: Duration,
    ) -> (
        FuturesUnordered<impl Future<Output = Reply<Attempt>>>,
        watch::Sender<Verdict>,
    ) {
        let (verdict, decided) = watch::channel(Verdict::Pending);
        let (ttl, share, number) = (attempt.ttl, attempt.share, attempt.attempt);
        let (waits, others_wait, give_up_at) =
            (attempt.waits, attempt.others_wait, attempt.give_up_at);
        self.on_the_way.sent(attempt.token, self.nodes.len());
        let (key, token) = (attempt.key.clone(), attempt.token.to_owned());
        let on_the_way = self.on_the_way.clone();
        let replies = self.fan_out(per_node, move |i, node| {
            let (key, token) = (key.clone(), token.clone());
            let (decided, on_the_way) = (decided.clone(), on_the_way.clone());
            async move {
                let attempt = Acquire {
                    key: &key,
                    token: &token,
                    ttl,
                    fencing: false,
                    attempt: number,
                    queue: false,
                    waits,
                    others_wait,
                    share,
                    give_up_at,
                    aside: false,
                };
                let outcome = node.acquire(&attempt).await;
                on_the_way.landed(&token, i);
                // Refused: nothing was written. An error may have landed all the same.
                if !matches!(outcome, Ok(Attempt::Busy { .. })) {
                    drop(io::spawn(settle(node, key, token, share, decided)));
                }
                outcome
            }
        });
        (replies, verdict)
    }

    /// How many nodes must grant (and keep renewing) a lock, a reader's place or one of
    /// `permits` permits. A majority for a lock and a reader (any two majorities share a node,
    /// where a writer and a reader exclude each other). For permits, more: with `h` holders each on `q` of `n` nodes and at
    /// most `permits` on any node, `h * q <= n * permits`, so `q > n * permits / (permits + 1)`
    /// keeps `h` at `permits` or below (on 3 nodes, every node for 2 permits or more).
    fn quorum_for(&self, share: Share) -> usize {
        match share {
            Share::Permits(p) if p > 1 => {
                let p = p as usize;
                self.nodes.len() * p / (p + 1) + 1
            }
            _ => self.quorum,
        }
    }

    /// The owner that holds `quorum` of the busy nodes, with its leases there.
    fn quorum_holder<'b>(
        &self,
        busy: &'b [(Option<Duration>, Option<String>)],
        quorum: usize,
    ) -> Option<(&'b str, Vec<Option<Duration>>)> {
        busy.iter().find_map(|(_, candidate)| {
            let candidate = candidate.as_deref()?;
            let leases: Vec<Option<Duration>> = busy
                .iter()
                .filter(|(_, holder)| holder.as_deref() == Some(candidate))
                .map(|(left, _)| *left)
                .collect();
            (leases.len() >= quorum).then_some((candidate, leases))
        })
    }
}

impl Redlock {
    /// Releases on the nodes, and returns once `wait_for` of them answered and the answers
    /// settle it (or every node did what it could): `Ok(true)` when a quorum held our token,
    /// `Ok(false)` when too many did not for that; an error otherwise, so the caller retries:
    /// the lock may still stand on a majority.
    async fn release_on(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
        wait_for: usize,
    ) -> Result<bool, LockError> {
        // Until the outcome is settled on a quorum (a release to every node goes on after).
        let mut releasing = Some(self.turns.releasing(key).await);
        let mut replies = self.fan_out(self.timeouts.command, |i, node| {
            let (key, token) = (key.clone(), token.to_owned());
            let on_the_way = self.on_the_way.clone();
            async move {
                on_the_way.arrived(&token, i).await;
                node.release(&key, &token, share).await
            }
        });
        // Ours only if a quorum deleted our key: a leftover on a minority (its expiry came
        // after our deadline) is not the lock, which the next holder may have on the majority.
        let (total, quorum) = (self.nodes.len(), self.quorum);
        let (mut deleted, mut kept, mut errors) = (0, 0, Vec::new());
        loop {
            let settled = deleted >= quorum || kept > total - quorum;
            if settled {
                drop(releasing.take());
            }
            if deleted + kept >= wait_for && settled {
                break;
            }
            match replies.next().await {
                Some(Ok(true)) => deleted += 1,
                Some(Ok(false)) => kept += 1,
                Some(Err(e)) => errors.push(e.to_string()),
                None => break,
            }
        }
        if deleted >= quorum {
            Ok(true)
        } else if kept > total - quorum {
            Ok(false)
        } else if deleted + kept >= quorum {
            // Enough answers, split: the silent nodes decide whether the lock was ours.
            Err(LockError::Backend {
                node: self.name.clone(),
                command: "release",
                key: Some(key.name.clone()),
                message: format!(
                    "{deleted} of {total} nodes held our token and {kept} did not, so whether \
                     the lock was still ours depends on the nodes that did not answer: {}",
                    errors.join("; ")
                ),
                source: None,
            })
        } else {
            Err(self.majority_down("release", key, &errors))
        }
    }
}

impl Store for Redlock {
    fn node(&self) -> &str {
        &self.name
    }

    fn hub(&self) -> &WaitHub {
        &self.hub
    }

    /// A failed attempt is undone in the background, on the nodes that granted it.
    fn undoes_failed_attempts(&self) -> bool {
        true
    }

    /// Answered by every node that answers in time, not only a quorum.
    async fn release_everywhere(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> Result<bool, LockError> {
        self.release_on(key, token, share, self.nodes.len()).await
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let (key, ttl) = (attempt.key, attempt.ttl);
        if attempt.fencing {
            return Err(LockError::InvalidOptions {
                key: key.name.clone(),
                reason: "fencing tokens are not offered on Redlock: independent nodes have no \
                         counter that increases across all of them, so any token would only look \
                         monotonic. Use a single Redis node or Redis Cluster for fencing, or drop \
                         `fencing`"
                    .to_owned(),
            });
        }
        let quorum = self.quorum_for(attempt.share);
        let per_node = self.node_timeout(ttl);
        // Until this attempt is decided (its stragglers run on without it). Not past the
        // caller's wait: an attempt that cannot have its turn by then goes without it, as it
        // would have alone, rather than after every attempt queued before it.
        let turn = tokio::time::timeout_at(attempt.give_up_at, self.turns.attempt(key))
            .await
            .ok();
        let started = Instant::now();
        let (mut replies, verdict) = self.attempt_on_every_node(attempt, per_node);
        let n = self.nodes.len();
        let (mut won, mut busy, mut errors, mut refused) =
            (0, Vec::new(), Vec::<String>::new(), None);
        // Which of a multi-key lock's keys a busy node named first: the one to wait on.
        let mut busy_at = None;
        // Read on while a quorum may still grant. Once it cannot, read on (each reply bounded
        // by `per_node`) until a holder with a quorum shows or too few nodes answer: who holds
        // the lock decides how to wait.
        while won < quorum {
            let can_win = n - busy.len() - errors.len() >= quorum;
            let majority_down = errors.len() > n - quorum;
            if !can_win && (majority_down || self.quorum_holder(&busy, quorum).is_some()) {
                break;
            }
            let Some(reply) = replies.next().await else {
                break;
            };
            match reply {
                Ok(Attempt::Acquired { .. }) => won += 1,
                Ok(Attempt::Busy {
                    retry_after,
                    holder,
                    at,
                }) => {
                    busy_at.get_or_insert(at);
                    busy.push((retry_after, holder));
                }
                Err(e @ (LockError::InvalidKey { .. } | LockError::InvalidOptions { .. })) => {
                    errors.push(e.to_string());
                    refused = Some(e);
                }
                Err(e) => errors.push(e.to_string()),
            }
            if won + busy.len() + errors.len() == self.quorum {
                // What is left are stragglers: a release that crosses this attempt now can
                // only meet it there.
                if let Some(turn) = &turn {
                    turn.let_releases_pass();
                }
            }
        }
        drop(replies);
        let elapsed = started.elapsed();
        let drift = crate::options::drift(ttl);
        let valid = ttl
            .checked_sub(elapsed + drift)
            .is_some_and(|v| !v.is_zero());
        if won >= quorum && valid && refused.is_none() {
            let _ = verdict.send(Verdict::Keep);
            return Ok(Attempt::Acquired { fence: None });
        }
        // Undone on every node, also where no answer came: the attempt may have landed anyway.
        // Only an attempt that held a quorum can have made someone wait for it, so only its undo
        // wakes waiters.
        let _ = verdict.send(Verdict::Undo {
            announce: won >= quorum,
        });
        if let Some(e) = refused {
            return Err(e);
        }
        if won + busy.len() < quorum {
            return Err(self.too_few("acquire", key, &errors, quorum));
        }
        let quorum_holder = self.quorum_holder(&busy, quorum);
        let holder = quorum_holder.as_ref().map(|&(holder, _)| holder.to_owned());
        let retry_after = match quorum_holder {
            // A release notification ends the wait. Until then only expiry frees a quorum: once
            // enough of the holder's nodes have let its lease run out. A holder whose release
            // has already been announced is still deleting the lock on its other nodes.
            Some((holder, mut leases))
                if !self
                    .hub
                    .released_recently(taken_channel(key, busy_at), holder) =>
            {
                leases.sort_by_key(|left| left.unwrap_or(Duration::MAX));
                leases[leases.len() - quorum]
            }
            // Nobody holds a quorum (contenders split the vote, or the lock is being let go),
            // or ours came too late: retry after a short, random pause, so contenders do not
            // split again in lockstep. No release will announce the end of a split.
            _ => Some(per_node * (getrandom::u32().unwrap_or(0) % 100 + 1) / 100),
        };
        Ok(Attempt::Busy {
            retry_after,
            // The holder a quorum agrees on, if any.
            holder,
            at: busy_at.unwrap_or(0),
        })
    }

    /// `Ok` once a quorum answered (whether any of them still held our token); an error when
    /// fewer did, so the caller retries: the lock may still stand on a majority.
    async fn release(&self, key: &LockKey, token: &str, share: Share) -> Result<bool, LockError> {
        self.release_on(key, token, share, self.quorum).await
    }

    /// Per lock: renewed on a quorum, impossible to keep (too many nodes lost our token: `Taken`
    /// if any node has another owner's token, else `Gone`), or unknown (retry). Returns as soon
    /// as every lock is decided.
    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        let owned: Arc<Vec<OwnedRenewal>> = Arc::new(batch.iter().map(OwnedRenewal::of).collect());
        let quorums: Vec<usize> = batch.iter().map(|r| self.quorum_for(r.share)).collect();
        let mut replies = self.fan_out(budget, |_, node| {
            let owned = owned.clone();
            async move {
                let batch: Vec<Renewal<'_>> = owned.iter().map(OwnedRenewal::renewal).collect();
                node.renew(&batch, budget).await
            }
        });
        let n = self.nodes.len();
        let mut yes = vec![0usize; batch.len()];
        let mut no = vec![0usize; batch.len()];
        let mut taken = vec![false; batch.len()];
        let mut answered = 0;
        let decided = |yes: &[usize], no: &[usize]| {
            yes.iter()
                .zip(no)
                .zip(&quorums)
                .all(|((y, nay), q)| *y >= *q || *nay > n - *q)
        };
        while let Some(reply) = replies.next().await {
            let Ok(flags) = reply else { continue };
            answered += 1;
            for (i, flag) in flags.into_iter().enumerate() {
                match flag {
                    Some(Renewed::Yes) => yes[i] += 1,
                    Some(lost) => {
                        no[i] += 1;
                        taken[i] |= lost == Renewed::Taken;
                    }
                    None => {}
                }
            }
            if decided(&yes, &no) {
                break;
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
        Ok(yes
            .into_iter()
            .zip(no)
            .zip(taken)
            .zip(quorums)
            .map(|(((yes, no), taken), quorum)| {
                if yes >= quorum {
                    Some(Renewed::Yes)
                } else if no > n - quorum {
                    Some(if taken { Renewed::Taken } else { Renewed::Gone })
                } else {
                    None
                }
            })
            .collect())
    }

    /// The owner that a quorum of nodes agrees on, its shortest remaining lease there and the
    /// longest time any of them has seen it hold the lock.
    async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
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
        // Held shared as it is held at all: by whoever a majority of the nodes hold, as the
        // owner is (a place on fewer nodes is a release or an undo on its way there).
        let holders = shared_holders(&infos, self.quorum);
        let held = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        Ok(LockInfo {
            owner: owner.map(str::to_owned),
            remaining: owner.and_then(|o| {
                infos
                    .iter()
                    .filter(|i| i.owner.as_deref() == Some(o))
                    .filter_map(|i| i.remaining)
                    .min()
            }),
            // Each node times it on its own clock, from the renewal that reached it first.
            held_for: owner.and_then(|o| {
                infos
                    .iter()
                    .filter(|i| i.owner.as_deref() == Some(o))
                    .filter_map(|i| i.held_for)
                    .max()
            }),
            fence: None,
            permits: infos
                .iter()
                .find_map(|i| i.permits)
                .filter(|_| held > 0)
                .map(|p| Permits { held, ..p }),
            readers: infos
                .iter()
                .find_map(|i| i.readers)
                .filter(|_| held > 0)
                .map(|_| held),
            holders,
            // The nodes hand nothing over, so nobody queues there.
            waiters: 0,
            queue: Vec::new(),
        })
    }

    /// On every node: an observer follows them all, and one answering is enough.
    async fn announce_taken(&self, key: &LockKey) -> Result<(), LockError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| timeout(self.timeouts.command, n.announce_taken(key))),
        )
        .await;
        if replies.iter().any(|r| matches!(r, Ok(Ok(())))) {
            return Ok(());
        }
        let missing = vec![format!("{} nodes did not answer", self.nodes.len())];
        Err(self.majority_down("announce", key, &missing))
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
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

/// A [`Renewal`] that each node's task can own: the tasks outlive the call's borrow of the
/// batch.
struct OwnedRenewal {
    key: LockKey,
    token: String,
    ttl_ms: u64,
    share: Share,
    note_held: Option<u64>,
}

impl OwnedRenewal {
    fn of(renewal: &Renewal<'_>) -> Self {
        Self {
            key: renewal.key.clone(),
            token: renewal.token.to_owned(),
            ttl_ms: renewal.ttl_ms,
            share: renewal.share,
            note_held: renewal.note_held,
        }
    }

    /// Redlock takes no fencing tokens, so there is no counter to keep.
    fn renewal(&self) -> Renewal<'_> {
        Renewal {
            key: &self.key,
            token: &self.token,
            ttl_ms: self.ttl_ms,
            share: self.share,
            fence: None,
            note_held: self.note_held,
        }
    }
}

/// Keeps or takes back one node's grant (or the attempt that may have landed), as the
/// acquisition decides; undecided when it is dropped means taken back.
async fn settle(
    node: Arc<RedisBackend>,
    key: LockKey,
    token: String,
    share: Share,
    mut decided: watch::Receiver<Verdict>,
) {
    let verdict = decided
        .wait_for(|v| !matches!(v, Verdict::Pending))
        .await
        .map_or(Verdict::Undo { announce: false }, |v| v.clone());
    let _ = match verdict {
        Verdict::Pending | Verdict::Keep => return,
        Verdict::Undo { announce: true } => node.release(&key, &token, share).await,
        Verdict::Undo { announce: false } => node.undo(&key, &token).await,
    };
}

/// The channel of the key a busy attempt found taken (a multi-key lock's `at`-th).
fn taken_channel(key: &LockKey, at: Option<usize>) -> &str {
    key.keys().get(at.unwrap_or(0)).unwrap_or(key).channel()
}

/// The readers or permit holders a quorum of the nodes shows, each with its shortest lease
/// among them, the longest first.
fn shared_holders(infos: &[LockInfo], quorum: usize) -> Vec<Place> {
    let mut seen: HashMap<&str, (usize, Duration)> = HashMap::new();
    for place in infos.iter().flat_map(|i| &i.holders) {
        let (nodes, shortest) = seen
            .entry(place.token.as_str())
            .or_insert((0, place.remaining));
        *nodes += 1;
        *shortest = (*shortest).min(place.remaining);
    }
    let mut holders: Vec<Place> = seen
        .into_iter()
        .filter(|(_, (nodes, _))| *nodes >= quorum)
        .map(|(token, (_, remaining))| Place::new(token, remaining))
        .collect();
    holders.sort_by_key(|p| std::cmp::Reverse(p.remaining));
    holders
}
