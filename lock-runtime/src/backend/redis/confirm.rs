//! Writes that count only once replicas hold them: `WAIT` after each acquisition and renewal
//! (`RegistryBuilder::confirm_replicas`).
//!
//! Replication is asynchronous: a master that the sentinels have given up on (partitioned from
//! them and from its replicas, but not from the lock holder) goes on accepting renewals, while
//! the replica promoted in its place lets the key expire and grants the lock again. With
//! confirmation on, a write counts only when `WAIT n` says that n replicas acknowledged it, so a
//! lease's local deadline rests on a key whose expiry (replicated as an absolute time: Redis 7
//! sends `SET .. PX` as `PXAT` and `PEXPIRE` as `PEXPIREAT`) those replicas hold as well.
//!
//! `WAIT` waits for the replication offset of the last command of *its own connection*, and
//! blocks that connection meanwhile. So confirmed writes do not use the shared connection (every
//! other operation would queue behind each `WAIT`), but one of their own ([`Route`]) to the same
//! master, driven by one task:
//! whatever was asked while a `WAIT` was under way is sent next as one pipeline, followed by a
//! single `WAIT` that confirms all of it (a group commit). At most one `WAIT` is pending at any
//! time, so a replica that does not answer costs each batch one `WAIT` timeout, never a queue of
//! them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot};

use futures_util::future::join_all;

use super::connection::{Connection, SharedConnection};
use super::errors;
use super::renewal::{Round, RENEW_CHUNK};
use super::scripts;
use crate::backend::contract::{Acquire, Attempt, Renewal, Renewed};
use crate::key::LockKey;
use crate::timeouts::Timeouts;
use crate::{error::LockError, io};

/// The most writes one `WAIT` confirms; more wait for the next batch.
const BATCH: usize = 64;

/// How a confirmed write went: the command's own reply (possibly an error reply), and how many
/// replicas acknowledged it, or why `WAIT` itself failed (an ACL without `+wait`, a replica).
pub(crate) struct Confirmed {
    pub reply: Value,
    pub acked: Result<u32, String>,
    /// The `WAIT` timeout it was sent with.
    pub waited: Duration,
}

impl Confirmed {
    /// Whether at least `replicas` replicas acknowledged the write.
    pub(crate) fn by(&self, replicas: u32) -> bool {
        self.acked.as_ref().is_ok_and(|n| *n >= replicas)
    }

    /// "1 of the 2 replicas asked for acknowledged it within 100ms", or what `WAIT` answered
    /// instead, for messages.
    pub(crate) fn describe(&self, replicas: u32) -> String {
        match &self.acked {
            Ok(n) => format!(
                "{n} of the {replicas} replicas asked for acknowledged it within {:?}",
                self.waited
            ),
            Err(e) => format!("`WAIT` failed ({e}), so no replica was counted"),
        }
    }
}

struct Job {
    command: Cmd,
    /// How long this write's caller can wait for replicas; `None`: it needs no confirmation
    /// (a release, sent here only to stay behind the acquisitions on this connection).
    wait: Option<Duration>,
    reply: oneshot::Sender<Result<Confirmed, LockError>>,
}

/// Where confirmed writes go: a connection of their own, to the server every other operation
/// goes to.
pub(crate) enum Route {
    /// One server: a second connection to it.
    Server(SharedConnection),
    /// The master Sentinels name: the confirming lane of the shared connection, so that both
    /// always talk to the same master and move together.
    Sentinel(Arc<SharedConnection>),
}

impl Route {
    async fn get(&self, what: &'static str) -> Result<Connection, LockError> {
        match self {
            Self::Server(own) => own.get(what, None).await,
            Self::Sentinel(shared) => match shared.get(what, None).await? {
                Connection::Sentinel(con) => Ok(Connection::Sentinel(con.confirming())),
                other => Ok(other),
            },
        }
    }
}

/// The connection and task that send confirmed writes for one deployment.
pub(crate) struct Confirmer {
    replicas: u32,
    node: String,
    timeouts: Timeouts,
    route: Arc<Route>,
    /// The batching task's queue, started on first use.
    jobs: OnceLock<mpsc::UnboundedSender<Job>>,
}

impl Confirmer {
    pub(crate) fn new(replicas: u32, route: Route, node: String, timeouts: Timeouts) -> Self {
        Self {
            replicas,
            node,
            timeouts,
            route: Arc::new(route),
            jobs: OnceLock::new(),
        }
    }

    /// How many replicas must acknowledge each write.
    pub(crate) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// An acquisition on the confirming connection: the acquire script, then `WAIT`. A lock
    /// taken but not acknowledged by enough replicas is released (before the caller may retry
    /// with the same token) and the attempt fails, so the acquire loop retries within `wait`.
    pub(crate) async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let cmd = if !attempt.key.is_multi() {
            scripts::acquire::call(attempt, false, "PUBLISH").cmd()
        } else {
            scripts::acquire_all::call(attempt).cmd()
        };
        // A fifth of the ttl: the lease's deadline runs from before the acquisition was sent, so
        // the wait only shortens it, and a replica slowed for a few ms must not fail a free lock.
        let wait = attempt.ttl / 5;
        let confirmed = self
            .send(cmd, Some(wait), "acquire", Some(&attempt.key.name))
            .await?;
        let reply = confirmed
            .reply
            .clone()
            .extract_error()
            .and_then(|v| Ok(redis::from_redis_value::<Vec<Value>>(v)?))
            .map_err(|e| self.error("acquire", Some(&attempt.key.name), e))?;
        let outcome = scripts::acquire::read(reply, attempt, &self.node)?;
        if matches!(outcome, Attempt::Acquired { .. }) && !confirmed.by(self.replicas) {
            return Err(self.unconfirmed_acquisition(attempt, &confirmed).await);
        }
        Ok(outcome)
    }

    /// A release on the confirming connection, with no `WAIT` of its own: behind every
    /// acquisition sent there before it, so a release that lets go of a cancelled acquisition
    /// can never reach the server ahead of the acquisition itself.
    pub(crate) async fn release(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        let cmd = scripts::release::call(key, token, false, "PUBLISH").cmd();
        let confirmed = self.send(cmd, None, "release", Some(&key.name)).await?;
        let released = confirmed
            .reply
            .extract_error()
            .and_then(|v| Ok(redis::from_redis_value::<i64>(v)?))
            .map_err(|e| self.error("release", Some(&key.name), e))?;
        Ok(scripts::release::released(released))
    }

    /// Releases a lock that enough replicas did not acknowledge, and says so.
    async fn unconfirmed_acquisition(
        &self,
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
            key: Some(attempt.key.name.clone()),
            message: format!(
                "took the lock, but {} (`confirm_replicas`), and a failover could hand an \
                 unacknowledged lock to a second holder: {released}. Check that the master has \
                 at least {} connected replica(s) in sync (`INFO replication`), or lower \
                 `confirm_replicas`",
                confirmed.describe(self.replicas),
                self.replicas
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
    pub(crate) async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        let chunks: Vec<Vec<usize>> = (0..batch.len())
            .collect::<Vec<_>>()
            .chunks(RENEW_CHUNK)
            .map(<[usize]>::to_vec)
            .collect();
        let calls = chunks.iter().map(|chunk| async move {
            let cmd = scripts::renew::call(batch, chunk.iter().copied()).cmd();
            let sent =
                tokio::time::timeout(budget, self.send(cmd, Some(budget / 2), "renew", None));
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
            if confirmed.by(self.replicas) {
                round.record(chunk, flags.into());
            } else {
                let why = format!(
                    "renewed on {}, but {} (`confirm_replicas`), so not counted: the leases run \
                     out at their deadlines unless a renewal is acknowledged before",
                    self.node,
                    confirmed.describe(self.replicas),
                );
                round.record_unconfirmed(chunk, flags, why);
            }
        }
        round.finish().map_err(|e| self.error("renew", None, e))
    }

    /// A failure of `command` (on `key`), for the caller.
    fn error(&self, command: &'static str, key: Option<&str>, e: redis::RedisError) -> LockError {
        super::errors::lock_error(&self.node, command, key, e)
    }

    /// Sends `command` on the confirming connection, then `WAIT` for the replicas at most
    /// `wait` (1 ms to half the command timeout, so the reply arrives before the command
    /// timeout fires); with no `wait`, no `WAIT` on its account.
    pub(crate) async fn send(
        &self,
        command: Cmd,
        wait: Option<Duration>,
        what: &'static str,
        key: Option<&str>,
    ) -> Result<Confirmed, LockError> {
        let jobs = self.jobs.get_or_init(|| {
            let (queue, jobs) = mpsc::unbounded_channel();
            let batches = Batches {
                replicas: self.replicas,
                node: self.node.clone(),
                longest_wait: self.timeouts.command / 2,
                route: self.route.clone(),
            };
            drop(io::spawn(batches.run(jobs)));
            queue
        });
        let (reply, replied) = oneshot::channel();
        let gone = || LockError::Backend {
            node: self.node.clone(),
            command: what,
            key: key.map(str::to_owned),
            message: "the task that confirms writes with the replicas is gone".into(),
            source: None,
        };
        jobs.send(Job {
            command,
            wait,
            reply,
        })
        .map_err(|_| gone())?;
        // The batch's failure, told as this caller's operation on its key.
        replied
            .await
            .unwrap_or_else(|_| Err(gone()))
            .map_err(|e| match e {
                LockError::Backend {
                    node,
                    message,
                    source,
                    ..
                } => LockError::Backend {
                    node,
                    command: what,
                    key: key.map(str::to_owned),
                    message,
                    source,
                },
                other => other,
            })
    }
}

/// The task behind a [`Confirmer`].
struct Batches {
    replicas: u32,
    node: String,
    longest_wait: Duration,
    route: Arc<Route>,
}

impl Batches {
    async fn run(self, mut queue: mpsc::UnboundedReceiver<Job>) {
        while let Some(first) = queue.recv().await {
            let mut jobs = vec![first];
            while jobs.len() < BATCH {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            // A caller that gave up (a cancelled acquisition) must not take a lock nobody
            // would release.
            jobs.retain(|job| !job.reply.is_closed());
            if !jobs.is_empty() {
                self.confirm(jobs).await;
            }
        }
    }

    /// Sends the writes and one `WAIT`, and answers each caller. A write refused with
    /// `NOSCRIPT` (a `SCRIPT FLUSH`, a new master) is sent once more after loading the scripts.
    async fn confirm(&self, mut jobs: Vec<Job>) {
        for attempt in 0..2 {
            let sent = match self.send(&jobs).await {
                Ok(sent) => sent,
                Err(error) => {
                    for job in jobs {
                        let _ = job.reply.send(Err(error.clone()));
                    }
                    return;
                }
            };
            let mut again = Vec::new();
            for (job, reply) in jobs.into_iter().zip(sent.replies) {
                if attempt == 0 && scripts::is_noscript(&reply) {
                    again.push(job);
                    continue;
                }
                let _ = job.reply.send(Ok(Confirmed {
                    reply,
                    acked: sent.acked.clone(),
                    waited: sent.waited,
                }));
            }
            if again.is_empty() {
                return;
            }
            if let Err(error) = self.load_scripts().await {
                for job in again {
                    let _ = job.reply.send(Err(error.clone()));
                }
                return;
            }
            jobs = again;
        }
    }

    /// One pipeline: the writes in order, then `WAIT` (unless none of them asks for it). Its
    /// reply to `WAIT` is what the replicas acknowledged of everything before it on this
    /// connection. The shortest wait asked for is the batch's: a write with a longer one that
    /// goes unconfirmed is retried by its caller, never counted.
    async fn send(&self, jobs: &[Job]) -> Result<Sent, LockError> {
        let wait = jobs.iter().filter_map(|job| job.wait).min().map(|wait| {
            let wait = wait.min(self.longest_wait).max(Duration::from_millis(1));
            // WAIT counts whole milliseconds.
            Duration::from_millis(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
        });
        let mut pipe = redis::pipe();
        for job in jobs {
            pipe.add_command(job.command.clone());
        }
        if let Some(wait) = wait {
            pipe.cmd("WAIT")
                .arg(self.replicas)
                .arg(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        }
        let count = jobs.len() + usize::from(wait.is_some());
        let mut con = self.route.get("confirm").await?;
        let mut replies = con
            .req_packed_commands(&pipe, 0, count)
            .await
            .map_err(|e| super::errors::lock_error(&self.node, "confirm", None, e))?;
        let acked = match wait.map(|_| replies.pop()) {
            None => Err("no confirmation was asked for".into()),
            Some(Some(Value::Int(n))) => Ok(u32::try_from(n).unwrap_or(0)),
            Some(Some(other)) => Err(match other.extract_error() {
                Err(e) => e.to_string(),
                Ok(value) => format!("unexpected reply {value:?}"),
            }),
            Some(None) => Err("no reply".into()),
        };
        let wait = wait.unwrap_or_default();
        Ok(Sent {
            replies,
            acked,
            waited: wait,
        })
    }

    async fn load_scripts(&self) -> Result<(), LockError> {
        let mut con = self.route.get("confirm").await?;
        scripts::load_all(&mut con)
            .await
            .map_err(|e| super::errors::lock_error(&self.node, "SCRIPT LOAD", None, e))
    }
}

/// A batch's replies: each write's, and `WAIT`'s for all of them.
struct Sent {
    replies: Vec<Value>,
    acked: Result<u32, String>,
    waited: Duration,
}
