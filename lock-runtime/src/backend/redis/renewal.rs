//! One renewal round on Redis: batches split into chunks, each renewed by one round trip, and
//! their answers collected.
//!
//! A chunk's exclusive locks go as `SET key token IFEQ token PX ttl GET` where the server has
//! it (Valkey 8.1+), pipelined; the rest (fenced locks too, whose counter the script keeps, and
//! renewals that note how long the lock has been held, [`Renewal::note_held`]), and every lock
//! on a server without it, go through the renewal script ([`scripts::RENEW_LUA`]), one call
//! per chunk.
//!
//! `SET key token IFEQ token PX ttl GET` is the renewal script's answer for a lock held as a
//! plain string, in one command: it sets the expiry only when the key holds our token, never
//! creates the key, and its `GET` returns what was there: our token (renewed), nil (gone:
//! [`Renewed::Gone`]) or another value (left untouched: [`Renewed::Taken`]); our token marked
//! as waited for (`WAITED` in the scripts' prelude) goes to the script, which keeps the mark.
//! Until a server has answered one (see [`Native`]), renewals go through the script, with one
//! `SET .. IFEQ` of the round's first exclusive lock pipelined before it as the probe: the
//! round costs one round trip whatever the answer, and the script's answer is the one that
//! counts. Once on, every error reply for a lock (`WRONGTYPE` for a key that is now a sorted
//! set, `OOM`, `MOVED`/`ASK` in a cluster, which a pipeline does not follow) sends that lock to
//! the script in the same round.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use super::errors::timed_out;
use super::native::{Native, OFF, ON, UNKNOWN};
use super::scripts;
use crate::backend::contract::{Renewal, Renewed, Share};

/// Renewal scripts are split so no single script call keeps Redis busy for long.
pub(crate) const RENEW_CHUNK: usize = 512;

/// What a renewal call learned: a flag per lock of its chunk (see [`renewed`]; `None`: no
/// answer for that lock), and the failure that left some without one.
pub(crate) struct Answers {
    pub flags: Vec<Option<i64>>,
    pub error: Option<redis::RedisError>,
}

impl Answers {
    /// No answer for any of `locks` locks.
    fn failed(locks: usize, error: redis::RedisError) -> Self {
        Self {
            flags: vec![None; locks],
            error: Some(error),
        }
    }

    /// Whether the call failed whole with an error of `kind`.
    pub(crate) fn failed_with(&self, kind: redis::ErrorKind) -> bool {
        self.flags.iter().all(Option::is_none)
            && self.error.as_ref().is_some_and(|e| e.kind() == kind)
    }
}

impl From<redis::RedisResult<Vec<i64>>> for Answers {
    fn from(reply: redis::RedisResult<Vec<i64>>) -> Self {
        match reply {
            Ok(flags) => Self {
                flags: flags.into_iter().map(Some).collect(),
                error: None,
            },
            Err(error) => Self {
                flags: Vec::new(),
                error: Some(error),
            },
        }
    }
}

/// One renewal round trip for `chunk` of `batch`, bounded by `budget`. With `ifeq` (not where a
/// pipeline cannot go: through the cluster client), exclusive locks are renewed with
/// `SET .. IFEQ` where the server takes it (see [`Native`]).
pub(crate) async fn renew_chunk<C: ConnectionLike + Send>(
    con: &mut C,
    batch: &[Renewal<'_>],
    chunk: &[usize],
    budget: Duration,
    ifeq: Option<&Native>,
) -> Answers {
    tokio::time::timeout(budget, renew_now(con, batch, chunk, ifeq))
        .await
        .unwrap_or_else(|_| Answers::failed(chunk.len(), timed_out(budget)))
}

/// `SET key token IFEQ token PX ttl GET` for one lock.
fn set_ifeq(pipe: &mut redis::Pipeline, lock: &Renewal<'_>) {
    pipe.cmd("SET")
        .arg(&lock.key.stored)
        .arg(lock.token)
        .arg("IFEQ")
        .arg(lock.token)
        .arg("PX")
        .arg(lock.ttl_ms)
        .arg("GET");
}

/// The renewal script for `locks` (positions in `chunk`).
fn renew_script(batch: &[Renewal<'_>], chunk: &[usize], locks: &[usize]) -> scripts::Call {
    scripts::renew::call(batch, locks.iter().map(|&at| chunk[at]))
}

/// One pipeline: `SET .. IFEQ` for the exclusive locks where the server takes it (else one
/// as the probe, while that is unknown), then the script for the rest. Locks whose `SET` got
/// an error reply go to the script in a second round trip, as does the script itself when its
/// pipelined call got one. Answers already read are kept when a later part fails.
async fn renew_now<C: ConnectionLike + Send>(
    con: &mut C,
    batch: &[Renewal<'_>],
    chunk: &[usize],
    ifeq: Option<&Native>,
) -> Answers {
    let exclusive = |at: &usize| {
        let lock = &batch[chunk[*at]];
        lock.share == Share::Exclusive && lock.fence.is_none()
    };
    // A renewal that notes how long the lock has been held needs the script; the probe goes
    // through the script anyway.
    let native = |at: &usize| exclusive(at) && batch[chunk[*at]].note_held.is_none();
    let state = ifeq.map_or(OFF, Native::state);
    let by_set: Vec<usize> = match state {
        ON => (0..chunk.len()).filter(native).collect(),
        _ => Vec::new(),
    };
    let probe = match state {
        UNKNOWN => (0..chunk.len()).find(exclusive),
        _ => None,
    };
    let by_script: Vec<usize> = (0..chunk.len()).filter(|at| !by_set.contains(at)).collect();
    let mut flags: Vec<Option<i64>> = vec![None; chunk.len()];
    let mut pipe = redis::pipe();
    for &at in by_set.iter().chain(&probe) {
        set_ifeq(&mut pipe, &batch[chunk[at]]);
    }
    let sets = by_set.len() + usize::from(probe.is_some());
    if !by_script.is_empty() {
        pipe.add_command(renew_script(batch, chunk, &by_script).cmd());
    }
    let count = sets + usize::from(!by_script.is_empty());
    let mut replies = match con.req_packed_commands(&pipe, 0, count).await {
        Ok(replies) => replies.into_iter(),
        Err(e) => return Answers::failed(chunk.len(), e),
    };
    let mut error = None;
    for &at in &by_set {
        let Some(reply) = replies.next() else { break };
        flags[at] = ifeq_flag(ifeq, batch[chunk[at]].token, reply);
    }
    if probe.is_some() {
        if let Some(reply) = replies.next() {
            // Only learned from: the script's answer for that lock is the one that counts.
            let _ = ifeq_flag(ifeq, "", reply);
        }
    }
    let mut retry: Vec<usize> = by_set
        .iter()
        .copied()
        .filter(|&at| flags[at].is_none())
        .collect();
    if !by_script.is_empty() {
        match replies.next() {
            // NOSCRIPT (the invocation loads it), or an answer a pipeline does not act on
            // (MOVED/ASK in a migration, which the single command follows; TRYAGAIN, which it
            // returns to the caller to split): the script again, alone.
            Some(Value::ServerError(_)) => retry.extend(&by_script),
            Some(reply) => match redis::from_redis_value::<Vec<i64>>(reply) {
                Ok(answers) => {
                    for (&at, flag) in by_script.iter().zip(answers) {
                        flags[at] = Some(flag);
                    }
                }
                Err(e) => error = Some(e.into()),
            },
            None => {}
        }
    }
    if !retry.is_empty() {
        retry.sort_unstable();
        match renew_script(batch, chunk, &retry)
            .run::<Vec<i64>>(con)
            .await
        {
            Ok(answers) => {
                for (&at, flag) in retry.iter().zip(answers) {
                    flags[at] = Some(flag);
                }
            }
            Err(e) => error = Some(e),
        }
    }
    // A reply short of its locks leaves them unknown.
    Answers { flags, error }
}

/// The script's flag for one `SET .. IFEQ .. GET` reply (1 renewed, 0 gone, -1 taken), or
/// `None` for an error reply: the script renews that lock instead. Teaches `ifeq` whether
/// the server takes the command.
fn ifeq_flag(ifeq: Option<&Native>, token: &str, reply: Value) -> Option<i64> {
    let learn = |outcome: Result<(), &redis::ServerError>| {
        if let Some(ifeq) = ifeq {
            ifeq.learn("SET IFEQ", outcome);
        }
    };
    match reply {
        Value::Nil => {
            learn(Ok(()));
            Some(0)
        }
        Value::ServerError(e) => {
            learn(Err(&e));
            None
        }
        value => match redis::from_redis_value::<Vec<u8>>(value) {
            Ok(found) => {
                learn(Ok(()));
                if found == token.as_bytes() {
                    Some(1)
                } else if scripts::waited_for(&found, token) {
                    // Left untouched (IFEQ compared the bare token): the script renews it and
                    // keeps the mark.
                    None
                } else {
                    Some(-1)
                }
            }
            Err(_) => None,
        },
    }
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

    pub(crate) fn record(&mut self, chunk: &[usize], answers: Answers) {
        for (&i, flag) in chunk.iter().zip(answers.flags) {
            if let Some(flag) = flag {
                self.renewed[i] = Some(scripts::renew::renewed(flag));
            }
        }
        if let Some(e) = answers.error {
            self.fail(e);
        }
    }

    /// A chunk that Redis renewed but too few replicas acknowledged (`why`): locks found gone
    /// or taken are recorded so, renewed ones stay unknown (retried, never lost on this alone).
    pub(crate) fn record_unconfirmed(
        &mut self,
        chunk: &[usize],
        flags: redis::RedisResult<Vec<i64>>,
        why: String,
    ) {
        match flags {
            Ok(flags) => {
                for (&i, flag) in chunk.iter().zip(flags) {
                    let found = scripts::renew::renewed(flag);
                    if found != Renewed::Yes {
                        self.renewed[i] = Some(found);
                    }
                }
                self.fail((redis::ErrorKind::Client, "not confirmed", why).into());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(resp: &str) -> Value {
        redis::parse_redis_value(resp.as_bytes()).expect("valid RESP")
    }

    #[test]
    fn a_set_ifeq_reply_reads_as_the_scripts_flag_and_turns_it_on() {
        for (resp, flag) in [
            ("$3\r\ntok\r\n", 1),
            ("$-1\r\n", 0),
            ("$5\r\nother\r\n", -1),
        ] {
            let ifeq = Native::default();
            assert!(!ifeq.on());
            assert_eq!(ifeq_flag(Some(&ifeq), "tok", reply(resp)), Some(flag));
            assert!(ifeq.on(), "{resp}");
        }
        // Ours, marked as waited for: left untouched, so the script renews it.
        let ifeq = Native::default();
        assert_eq!(
            ifeq_flag(Some(&ifeq), "tok", reply("$5\r\ntok+w\r\n")),
            None
        );
    }

    #[test]
    fn a_server_without_ifeq_or_an_acl_refusal_turns_it_off_other_errors_teach_nothing() {
        for other in [
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "-OOM command not allowed when used memory > 'maxmemory'.\r\n",
            "-MOVED 3999 127.0.0.1:6381\r\n",
            "-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            let ifeq = Native::default();
            assert_eq!(ifeq_flag(Some(&ifeq), "tok", reply(other)), None, "{other}");
            assert_eq!(ifeq.state(), UNKNOWN, "{other}");
        }
        for refusal in [
            "-ERR syntax error\r\n",
            "-NOPERM User locker has no permissions to run the 'set' command\r\n",
        ] {
            let ifeq = Native::default();
            ifeq_flag(Some(&ifeq), "tok", reply("$3\r\ntok\r\n"));
            assert_eq!(
                ifeq_flag(Some(&ifeq), "tok", reply(refusal)),
                None,
                "{refusal}"
            );
            assert_eq!(ifeq.state(), OFF, "{refusal}: off, also after it was on");
        }
    }
}
