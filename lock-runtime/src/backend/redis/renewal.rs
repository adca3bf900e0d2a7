//! One renewal round on Redis: batches split into script calls, and their answers collected.

use std::time::Duration;

use super::errors::timed_out;
use super::scripts;
use crate::backend::contract::{Renewal, Renewed};

/// Renewal scripts are split so no single script call keeps Redis busy for long.
pub(crate) const RENEW_CHUNK: usize = 512;

/// One renewal script call for `chunk` of `batch`, bounded by `budget`: a flag per lock (see
/// [`renewed`]).
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
