//! The Lua scripts that make each lock operation one atomic round trip.
//!
//! The data layout is the common one (redis-py's `Lock`, redsync, node-redlock): one string per
//! lock holding the owner's token, with a `PX` expiry. A service in another language that locks
//! the same Redis key with `SET key token NX PX ttl` excludes ours, and ours excludes it.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock, `KEYS[2]` fencing counter; `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to
/// take a fencing token. Used with fencing, and after a plain `SET NX PX` was refused.
///
/// Returns `{1, fence}` when acquired (fence 0 without fencing), `{0, pttl}` when busy, `{2, type}`
/// when the key holds something that is not a lock. A retry with the same token after a lost
/// reply finds its own token and takes the lock again instead of waiting for itself. The counter
/// is incremented in the same script as the `SET`, so no holder can ever see an older token than
/// a previous holder.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r"
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind ~= 'string' and kind ~= 'none' then return {2, kind} end
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    ok = true
  end
end
if ok then
  if ARGV[3] == '1' then return {1, redis.call('INCR', KEYS[2])} end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` lock; `ARGV[1]` token, `ARGV[2]` `PUBLISH` (or `SPUBLISH` in a cluster). Deletes only
/// the owner's lock and tells waiters on the lock's channel. `pcall` so a key of another type
/// reads as "not ours" instead of an error.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[2], KEYS[1], 'released')
  return 1
end
return 0
";

/// `KEYS` locks; `ARGV` token and ttl ms for each key in turn. One script call renews a whole
/// batch: the keeper sends one command per batch instead of one per lock. Returns per key 1
/// (renewed), 0 (no such key: expired or deleted) or -1 (someone else's value); a lock that is
/// no longer ours is never touched.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
const RENEW_LUA: &str = r"
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

/// `KEYS[1]` lock, `KEYS[2]` fencing counter. Returns `{token or false, pttl, fence or false}`.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
const INSPECT_LUA: &str = r"
local token = redis.pcall('GET', KEYS[1])
if type(token) ~= 'string' then token = false end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
";

/// `KEYS[1]` lock; `ARGV[1]` the publish command. Deletes whatever lock is there (an operator's
/// decision) and wakes waiters.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
const FORCE_UNLOCK_LUA: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
local n = redis.call('DEL', KEYS[1])
if n == 1 then redis.call(ARGV[1], KEYS[1], 'released') end
return n
";

/// Every script, for loading them all when a connection opens.
pub(crate) const ALL: [&str; 5] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    RENEW_LUA,
    INSPECT_LUA,
    FORCE_UNLOCK_LUA,
];
