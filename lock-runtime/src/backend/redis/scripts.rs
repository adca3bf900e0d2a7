//! The Lua scripts that make each lock operation one atomic round trip.
//!
//! The data layout is the common one (redis-py's `Lock`, redsync, node-redlock): one string per
//! lock holding the owner's token, with a `PX` expiry. A service in another language that locks
//! the same Redis key with `SET key token NX PX ttl` excludes ours, and ours excludes it.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock, `KEYS[2]` fencing counter (needed only with fencing: without it the runtime
/// names the lock alone); `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to take a fencing
/// token. Used with fencing, and after a plain `SET NX PX` was refused.
///
/// Returns `{1, fence}` when acquired (fence 0 without fencing), `{0, pttl, owner}` when busy (the
/// holder's remaining lease and token), `{2, type}` when the key holds something that is not a
/// lock. A retry with the same token after a lost
/// reply finds its own token and takes the lock again instead of waiting for itself. The counter
/// is incremented in the same script as the `SET`, so no holder can ever see an older token than
/// a previous holder.
///
/// The counter expires a day after the last fenced acquisition, so per-entity keys
/// do not pile up. A missing counter (new, expired, deleted or lost with the server's data)
/// starts at the server's clock in microseconds (`TIME`): an old counter started at its own
/// clock reading and grew by one per fenced acquisition, far less than one per microsecond, so
/// the restarted one begins above every token it handed out, as long as this server's clock is
/// not behind the old one's by more than the time since the old counter was last used. Lua
/// numbers are doubles, exact to 2^53: microseconds since 1970 stay below that until 2255.
pub const ACQUIRE_LUA: &str = r"
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local owner
if not ok then
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind ~= 'string' and kind ~= 'none' then return {2, kind} end
  owner = redis.call('GET', KEYS[1])
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    ok = true
  end
end
if ok then
  if ARGV[3] ~= '1' then return {1, 0} end
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  redis.call('PEXPIRE', KEYS[2], '86400000')
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1]), owner}
";

/// [`ACQUIRE_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

/// `KEYS[1]` lock; `ARGV[1]` token, `ARGV[2]` `PUBLISH` (or `SPUBLISH` in a cluster). Deletes only
/// the owner's lock and tells waiters on the lock's channel. `pcall` so a key of another type
/// reads as "not ours" instead of an error.
///
/// The message is the SHA-1 of the released token: it names the tenure without handing out
/// the token itself, so a release that several Redlock nodes publish wakes one waiter per
/// process, not one per node.
pub const RELEASE_LUA: &str = r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[2], KEYS[1], redis.sha1hex(ARGV[1]))
  return 1
end
return 0
";

/// [`RELEASE_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// `KEYS[1]` lock; `ARGV[1]` token. [`RELEASE_LUA`] without the notification: it takes back a
/// Redlock attempt that won only a minority of nodes. Nobody waits for such an attempt to end
/// (no one saw it hold a quorum), and telling them would wake waiters for nothing.
pub const UNDO_LUA: &str = r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// [`UNDO_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static UNDO: LazyLock<Script> = LazyLock::new(|| Script::new(UNDO_LUA));

/// `KEYS` locks; `ARGV` token and ttl ms for each key in turn. One script call renews a whole
/// batch: the keeper sends one command per batch instead of one per lock. Returns per key 1
/// (renewed), 0 (no such key: expired or deleted) or -1 (someone else's value); a lock that is
/// no longer ours is never touched.
pub const RENEW_LUA: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if value == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  elseif value == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
";

/// [`RENEW_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

/// `KEYS[1]` lock, `KEYS[2]` fencing counter. Returns `{token or false, pttl, fence or false}`.
pub const INSPECT_LUA: &str = r"
local token = redis.pcall('GET', KEYS[1])
if type(token) ~= 'string' then token = false end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
";

/// [`INSPECT_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

/// `KEYS[1]` lock; `ARGV[1]` the publish command. Deletes whatever lock is there (an operator's
/// decision) and wakes waiters, naming the tenure as [`RELEASE_LUA`] does.
pub const FORCE_UNLOCK_LUA: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
local token = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call(ARGV[1], KEYS[1], redis.sha1hex(token))
return 1
";

/// [`FORCE_UNLOCK_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));

/// Every script, for loading them all when a connection opens.
pub(crate) const ALL: [&str; 6] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    UNDO_LUA,
    RENEW_LUA,
    INSPECT_LUA,
    FORCE_UNLOCK_LUA,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::contract::FENCE_EXPIRY_MS;

    #[test]
    fn the_acquire_script_expires_counters_after_fence_expiry_ms() {
        assert!(ACQUIRE_LUA.contains(&format!("'PEXPIRE', KEYS[2], '{FENCE_EXPIRY_MS}'")));
    }
}
