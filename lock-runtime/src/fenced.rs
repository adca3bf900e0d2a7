//! Fenced writes: Redis data that refuses a stale lock holder.
//!
//! A fencing token only protects what checks it (Kleppmann's "How to do distributed
//! locking"): a holder paused past its lease wakes up believing it still holds the lock, and its
//! late write lands after the next holder's. [`FencedKey`] makes a Redis key check it: each
//! write carries the writer's token, and one script refuses it if a higher token was already
//! written to that key, or runs it and records the token. The check and the write are one
//! atomic step on the server, so no write can slip in between.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs, Value};

/// `KEYS[1]` the data, `KEYS[2]` the highest token written to it; `ARGV[1]` the writer's token,
/// `ARGV[2]` a command whose first argument is `KEYS[1]`, `ARGV[3..]` its other arguments.
/// Returns `{0, highest}` (refused), or `{1, the command's reply}`. A command that fails leaves
/// the record as it was.
const FENCED_WRITE_LUA: &str = r"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if token < highest then return {0, highest} end
local reply = redis.pcall(ARGV[2], KEYS[1], unpack(ARGV, 3))
if type(reply) == 'table' and reply.err then return reply end
if token > highest then redis.call('SET', KEYS[2], ARGV[1]) end
return {1, reply}
";

/// The largest token the script compares exactly: Lua numbers are doubles.
const MAX_FENCE: u64 = (1 << 53) - 1;

static FENCED_WRITE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(FENCED_WRITE_LUA));

/// A Redis key whose writes carry the writer's fencing token, and which refuses a writer whose
/// token is lower than one already written: a holder that lost its lock while paused cannot
/// overwrite the next holder's data.
///
/// The highest token written is kept beside the key ([`record_key`](Self::record_key), with no
/// expiry: delete it with the data). A token equal to the highest is accepted (one holder
/// writing twice: no two holders of a lock get the same token). Any command whose first
/// argument is the key can be fenced: `SET`, `HSET`, `INCRBY`, `XADD`...
///
/// # Limits
///
/// - **One lock per key.** A token is only meaningful against tokens of the same lock: fence a
///   key with the tokens of one lock key (or one multi-key lock's keys) only. Tokens of two
///   locks do not compare (each is at least the Redis server's clock in microseconds when it
///   was taken, so a lock taken later can carry a lower token than another lock's), and a key
///   written under two locks refuses the writes of whichever has the lower tokens.
/// - **Redis Cluster.** The record is `fenced:{key}` (`fenced:key` when the key has a hash tag
///   of its own), in the key's slot, for every key that has a hash tag or no `}` at all. A key
///   without a hash tag that has a `}` (`a}b`, `{}x`) cannot have its record in its own slot:
///   in a cluster every write to it fails with `CROSSSLOT` (nothing is written). Give such a
///   key a hash tag (`{a}b`).
/// - **ACL.** The user runs the script by hash: `+evalsha +script|load` (loaded again after a
///   `SCRIPT FLUSH` or a restart), and inside it `+get +set` on the record and the fenced
///   command on the key: for instance `~balance:* ~fenced:* +evalsha +script|load +get +set
///   +incrby` (a key with its own hash tag has its record at `fenced:` plus its name, which
///   `~fenced:*` covers too).
///
/// ```no_run
/// # async fn demo(con: &mut redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use lock_runtime::{distributed_lock, FencedKey, FencedWrite};
///
/// #[distributed_lock(key = "account:<id>", ttl = "10s", fencing = true)]
/// async fn credit(con: &mut redis::aio::MultiplexedConnection, id: u64, amount: i64)
///     -> Result<(), lock_runtime::LockError>
/// {
///     let fence = lock_runtime::current().and_then(|lock| lock.fence()).expect("fencing = true");
///     let balance = FencedKey::new(format!("balance:{id}"));
///     match balance.write::<i64>(con, fence, "INCRBY", amount).await {
///         Ok(FencedWrite::Written(now)) => println!("balance {now}"),
///         // A newer holder wrote first: this one's lock is gone, and nothing was changed.
///         Ok(FencedWrite::Refused { highest }) => println!("stale: token {fence} < {highest}"),
///         Err(e) => println!("redis: {e}"),
///     }
///     Ok(())
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedKey {
    key: String,
    record: String,
}

/// What became of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum FencedWrite<T> {
    /// The token was at least the highest written to the key: the command ran, and this is its
    /// reply.
    Written(T),
    /// A writer with a higher token came first: nothing was changed. The writer's lock is no
    /// longer its own.
    Refused {
        /// The highest token written to the key.
        highest: u64,
    },
}

impl<T> FencedWrite<T> {
    /// Whether the write was refused.
    #[must_use]
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }
}

impl FencedKey {
    /// The Redis key `key` (the data's own name: no registry prefix is added).
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        let key = key.into();
        let record = crate::names::companion(crate::names::RECORD_NAMESPACE, &key);
        Self { key, record }
    }

    /// The data's key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key that keeps the highest token written to [`key`](Self::key).
    #[must_use]
    pub fn record_key(&self) -> &str {
        &self.record
    }

    /// Runs `command` with this key as its first argument and `args` after it, if `fence` is at
    /// least the highest token written to the key, and records `fence`; else changes nothing.
    /// One script: nothing can write between the check and the write.
    ///
    /// # Errors
    /// The connection's errors, and the command's own (`WRONGTYPE`...), which leave the key
    /// and its record as they were; a `fence` of 2^53 or more (which the script's Lua numbers
    /// cannot compare exactly) before anything is sent.
    pub async fn write<T: FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
        fence: u64,
        command: &str,
        args: impl ToRedisArgs,
    ) -> RedisResult<FencedWrite<T>> {
        if fence > MAX_FENCE {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "fencing token out of range",
                format!(
                    "token {fence} for `{}` is 2^53 or more, which the record's script (Lua \
                     numbers) cannot compare exactly; nothing was sent. The library's own tokens \
                     stay below it; fence this key with tokens below 2^53",
                    self.key
                ),
            )));
        }
        let reply: Vec<Value> = FENCED_WRITE
            .key(&self.key)
            .key(&self.record)
            .arg(fence)
            .arg(command)
            .arg(args)
            .invoke_async(con)
            .await?;
        let mut reply = reply.into_iter();
        let written: i64 = FromRedisValue::from_redis_value(reply.next().unwrap_or(Value::Nil))
            .map_err(RedisError::from)?;
        // A nil reply ends the script's table early: it is absent, not `Nil`.
        let rest = reply.next().unwrap_or(Value::Nil);
        if written == 1 {
            Ok(FencedWrite::Written(
                T::from_redis_value(rest).map_err(RedisError::from)?,
            ))
        } else {
            Ok(FencedWrite::Refused {
                highest: u64::from_redis_value(rest).map_err(RedisError::from)?,
            })
        }
    }

    /// The highest token written to the key, if any.
    ///
    /// # Errors
    /// The connection's errors.
    pub async fn highest(&self, con: &mut impl ConnectionLike) -> RedisResult<Option<u64>> {
        redis::cmd("GET").arg(&self.record).query_async(con).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot Redis Cluster puts `key` in.
    fn slot(key: &str) -> u16 {
        let hashed = crate::names::hash_tag(key).unwrap_or(key);
        crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
    }

    #[test]
    fn the_record_shares_the_keys_cluster_slot() {
        assert_eq!(
            FencedKey::new("balance:7").record_key(),
            "fenced:{balance:7}"
        );
        assert_eq!(
            FencedKey::new("user:{42}:profile").record_key(),
            "fenced:user:{42}:profile"
        );
        // Keys with a hash tag (also after stray braces) or without a `}`.
        for key in [
            "balance:7",
            "user:{42}:profile",
            "{42}",
            "x}{42}",
            "}{42}{7}",
            "a{b",
            "{",
            "{{42}}",
        ] {
            let record = FencedKey::new(key);
            assert_eq!(slot(record.record_key()), slot(key), "{key}");
        }
        // The documented limit: no hash tag (an empty first one counts as none), and a `}`.
        for key in ["a}b", "{}x", "}", "{}x{42}"] {
            let record = FencedKey::new(key);
            assert_ne!(slot(record.record_key()), slot(key), "{key}");
        }
    }
}
