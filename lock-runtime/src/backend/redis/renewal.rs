//! One renewal round on Redis: batches split into chunks, each renewed by one round trip, and
//! their answers collected.
//!
//! A chunk's exclusive locks go as `SET key token IFEQ token PX ttl GET` where the server has
//! it (Valkey 8.1+), pipelined; the rest, and every lock on a server without it, go through
//! the renewal script ([`scripts::RENEW_LUA`]), one call per chunk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ServerErrorKind, Value};

use super::errors::timed_out;
use super::scripts;
use crate::backend::contract::{Renewal, Renewed, Share};

/// Renewal scripts are split so no single script call keeps Redis busy for long.
pub(crate) const RENEW_CHUNK: usize = 512;

/// Whether one server (one connection's) renews exclusive locks with `SET .. IFEQ`.
///
/// `SET key token IFEQ token PX ttl GET` is the renewal script's answer for a lock held as a
/// plain string, in one command: it sets the expiry only when the key holds our token, never
/// creates the key, and its `GET` returns what was there: our token (renewed), nil (gone:
/// [`Renewed::Gone`]) or another value (left untouched: [`Renewed::Taken`]). Redis runs it
/// without Lua, which costs it less than a script call (see the benchmark's renewal item).
///
/// There is no probe of its own: the first renewal is the probe. A server without `IFEQ`
/// (Redis 7.x answers `ERR syntax error`; any `ERR`), or an ACL that refuses the command
/// (`NOPERM`), turns it off for good on this connection, and those locks are renewed by the
/// script in the same round, so a lease never depends on the answer. Every other error
/// reply for a lock (`WRONGTYPE` for a key that is now a sorted set, `OOM`, `MOVED`/`ASK`
/// in a cluster, which a pipeline does not follow) sends that lock to the script as well,
/// which answers exactly as before. A connection that moves to another server (a Sentinel
/// failover) keeps what it learned; a new server without `IFEQ` turns it off at its first
/// answer.
#[derive(Debug, Default)]
pub(crate) struct IfEq {
    refused: AtomicBool,
}

impl IfEq {
    /// Whether `SET .. IFEQ` is still worth sending (until a server refused it).
    pub(crate) fn tried(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// Turns it off after `reply` when that says the server does not take the command.
    fn learn(&self, reply: &redis::ServerError) {
        if matches!(
            reply.kind(),
            Some(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
        ) {
            tracing::debug!(
                error = %reply,
                "this server does not renew with SET IFEQ: renewals use the script"
            );
            self.refused.store(true, Ordering::Relaxed);
        }
    }
}

/// One renewal round trip for `chunk` of `batch`, bounded by `budget`: a flag per lock (see
/// [`renewed`]). With `ifeq` (not where a pipeline cannot go: through the cluster client),
/// exclusive locks are renewed with `SET .. IFEQ` while the server takes it (see [`IfEq`]).
pub(crate) async fn renew_chunk<C: ConnectionLike + Send>(
    con: &mut C,
    batch: &[Renewal<'_>],
    chunk: &[usize],
    budget: Duration,
    ifeq: Option<&IfEq>,
) -> redis::RedisResult<Vec<i64>> {
    tokio::time::timeout(budget, renew_now(con, batch, chunk, ifeq))
        .await
        .unwrap_or_else(|_| Err(timed_out(budget)))
}

async fn renew_now<C: ConnectionLike + Send>(
    con: &mut C,
    batch: &[Renewal<'_>],
    chunk: &[usize],
    ifeq: Option<&IfEq>,
) -> redis::RedisResult<Vec<i64>> {
    let mut flags: Vec<Option<i64>> = vec![None; chunk.len()];
    if let Some(ifeq) = ifeq.filter(|ifeq| ifeq.tried()) {
        let plain: Vec<usize> = (0..chunk.len())
            .filter(|&at| batch[chunk[at]].share == Share::Exclusive)
            .collect();
        if !plain.is_empty() {
            let mut pipe = redis::pipe();
            for &at in &plain {
                let lock = &batch[chunk[at]];
                pipe.cmd("SET")
                    .arg(lock.redis_key)
                    .arg(lock.token)
                    .arg("IFEQ")
                    .arg(lock.token)
                    .arg("PX")
                    .arg(lock.ttl_ms)
                    .arg("GET");
            }
            let replies = con.req_packed_commands(&pipe, 0, plain.len()).await?;
            for (&at, reply) in plain.iter().zip(replies) {
                flags[at] = ifeq_flag(ifeq, batch[chunk[at]].token, reply);
            }
        }
    }
    let rest: Vec<usize> = (0..chunk.len()).filter(|&at| flags[at].is_none()).collect();
    if !rest.is_empty() {
        let mut call = scripts::RENEW.prepare_invoke();
        for &at in &rest {
            let lock = &batch[chunk[at]];
            call.key(lock.redis_key).arg(lock.token).arg(lock.ttl_ms);
        }
        let answers: Vec<i64> = call.invoke_async(con).await?;
        for (&at, flag) in rest.iter().zip(answers) {
            flags[at] = Some(flag);
        }
    }
    // A reply short of its locks leaves them unknown, as a script's short answer does.
    Ok(flags.into_iter().map_while(|flag| flag).collect())
}

/// The script's flag for one `SET .. IFEQ .. GET` reply (1 renewed, 0 gone, -1 taken), or
/// `None` for an error reply: the script renews that lock instead.
fn ifeq_flag(ifeq: &IfEq, token: &str, reply: Value) -> Option<i64> {
    match reply {
        Value::Nil => Some(0),
        Value::ServerError(e) => {
            ifeq.learn(&e);
            None
        }
        value => match redis::from_redis_value::<Vec<u8>>(value) {
            Ok(found) => Some(if found == token.as_bytes() { 1 } else { -1 }),
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

    pub(crate) fn record(&mut self, chunk: &[usize], flags: redis::RedisResult<Vec<i64>>) {
        match flags {
            Ok(flags) => {
                for (&i, flag) in chunk.iter().zip(flags) {
                    self.renewed[i] = Some(renewed(flag));
                }
            }
            Err(e) => self.fail(e),
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
                    let found = renewed(flag);
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

/// The script's answer for one lock: 1 renewed, 0 gone, -1 taken.
fn renewed(flag: i64) -> Renewed {
    match flag {
        1 => Renewed::Yes,
        0 => Renewed::Gone,
        _ => Renewed::Taken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(resp: &str) -> Value {
        redis::parse_redis_value(resp.as_bytes()).expect("valid RESP")
    }

    #[test]
    fn a_set_ifeq_reply_reads_as_the_scripts_flag() {
        let ifeq = IfEq::default();
        assert_eq!(ifeq_flag(&ifeq, "tok", reply("$3\r\ntok\r\n")), Some(1));
        assert_eq!(ifeq_flag(&ifeq, "tok", reply("$-1\r\n")), Some(0), "gone");
        assert_eq!(ifeq_flag(&ifeq, "tok", reply("$5\r\nother\r\n")), Some(-1));
        assert!(ifeq.tried());
    }

    #[test]
    fn a_server_without_ifeq_or_an_acl_refusal_turns_it_off_other_errors_go_to_the_script() {
        for other in [
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "-OOM command not allowed when used memory > 'maxmemory'.\r\n",
            "-MOVED 3999 127.0.0.1:6381\r\n",
            "-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            let ifeq = IfEq::default();
            assert_eq!(ifeq_flag(&ifeq, "tok", reply(other)), None, "{other}");
            assert!(ifeq.tried(), "{other}");
        }
        for refusal in [
            "-ERR syntax error\r\n",
            "-NOPERM User locker has no permissions to run the 'set' command\r\n",
        ] {
            let ifeq = IfEq::default();
            assert_eq!(ifeq_flag(&ifeq, "tok", reply(refusal)), None, "{refusal}");
            assert!(!ifeq.tried(), "{refusal}");
        }
    }
}
