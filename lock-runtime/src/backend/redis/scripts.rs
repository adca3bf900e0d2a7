//! The Lua scripts that make each lock operation one atomic round trip.
//!
//! The data layout is the common one (redis-py's `Lock`, redsync, node-redlock): one string per
//! lock holding the owner's token, with a `PX` expiry. A service in another language that locks
//! the same Redis key with `SET key token NX PX ttl` excludes ours, and ours excludes it. Our
//! waiters also queue up beside the lock, so that a release hands it straight to the oldest.

use std::sync::LazyLock;

use redis::{Cmd, Script};

/// The Lua every script that needs them begins with: the server's clock in milliseconds, the
/// tag that marks a sorted set as ours (readers or a semaphore, see [`ACQUIRE_LUA`]; any other
/// sorted set is application data), and a fencing counter's next value (`INCR`, or the
/// server's clock in microseconds for a counter that starts afresh, with `true`).
macro_rules! common_lua {
    () => {
        r"
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function shared_tag_of(key)
  local tag = redis.call('ZRANGEBYSCORE', key, '+inf', '+inf', 'LIMIT', 0, 1)[1]
  if tag and (tag == '#read' or string.match(tag, '^#permits=%d+$')) then return tag end
  return nil
end
local function next_fence(key)
  local fence = redis.call('INCR', key)
  if fence ~= 1 then return fence, false end
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2]), true
end
"
    };
}

/// The Lua both [`ACQUIRE_LUA`] and [`RELEASE_LUA`] begin with: taking a fencing token, and
/// handing the lock to the oldest live waiter.
///
/// The waiters' queue is two keys beside the lock, in its slot: `queue:…` (a sorted set of
/// waiters' tokens, scored by arrival) and `queued:…` (a hash from each token to
/// `"<deadline ms> <ttl ms> <fencing 0|1> <place>"`, the deadline on the server's clock, the
/// place the number of the waiter's attempt that last kept it). A waiter whose deadline has
/// passed (it stopped renewing its place: gone, or gave up without saying so) is dropped when it
/// reaches the head, never handed the lock. A handed lock expires with the place it went to, so
/// a waiter that died in the queue holds it no longer than its place had left.
///
/// A script that publishes does so before it changes the lock: a user whose ACL lacks the
/// publish command gets the refusal with the lock untouched.
macro_rules! queue_lua {
    () => {
        concat!(
            common_lua!(),
            r"
local function take_fence(wanted)
  if wanted ~= '1' then return 0 end
  local fence, restarted = next_fence(KEYS[2])
  if restarted then redis.call('SET', KEYS[2], string.format('%d', fence)) end
  redis.call('PEXPIRE', KEYS[2], '86400000')
  return fence
end
local function leave_queue(token)
  if #KEYS < 4 or redis.call('ZREM', KEYS[3], token) == 0 then return false end
  redis.call('HDEL', KEYS[4], token)
  return true
end
local function read_place(entry)
  if not entry then return nil end
  local deadline, ttl, fencing, place = string.match(entry, '^(%d+) (%d+) ([01]) (%d+)$')
  if not deadline then return nil end
  return tonumber(deadline), ttl, fencing, place
end
local function oldest_live_place()
  if #KEYS < 4 or redis.call('EXISTS', KEYS[3]) == 0 then return nil end
  local now = now_ms()
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then return nil end
    local deadline = read_place(redis.call('HGET', KEYS[4], head))
    if deadline and deadline > now then return head, deadline end
    leave_queue(head)
  end
end
local function oldest_live_waiter()
  local head = oldest_live_place()
  if not head then return nil end
  local deadline, _, fencing, place = read_place(redis.call('HGET', KEYS[4], head))
  return head, deadline, fencing, place
end
local function hand_over(waiter, deadline, fencing, place, released, publish)
  local fence = take_fence(fencing)
  local next = redis.sha1hex(waiter) .. ':' .. string.format('%d', fence) .. ':' .. place
  redis.call(publish, KEYS[1], released .. ':' .. next)
  leave_queue(waiter)
  redis.call('SET', KEYS[1], waiter, 'PX', math.max(deadline - now_ms(), 1))
end
local function settle_shared(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) <= 1 then
    redis.call('DEL', KEYS[1])
    return false
  end
  local last = redis.call('ZRANGE', KEYS[1], -2, -2, 'WITHSCORES')[2]
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last) - now, 1))
  return true
end
local function release_permit(token, publish)
  local deadline = tonumber(redis.call('ZSCORE', KEYS[1], token))
  if not deadline then return 0 end
  local now = now_ms()
  local ours = deadline > now
  local released = redis.sha1hex(token)
  if redis.call('ZCOUNT', KEYS[1], '(' .. now, '(+inf') <= (ours and 1 or 0) then
    local waiter, waiter_deadline, fencing, place = oldest_live_waiter()
    if waiter then
      redis.call('DEL', KEYS[1])
      hand_over(waiter, waiter_deadline, fencing, place, released, publish)
      return ours and 2 or 0
    end
  end
  redis.call(publish, KEYS[1], released)
  redis.call('ZREM', KEYS[1], token)
  settle_shared(now)
  return ours and 1 or 0
end
"
        )
    };
}

/// `KEYS[1]` lock, `KEYS[2]` fencing counter, `KEYS[3]`/`KEYS[4]` the waiters' queue (see
/// below); `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to take a fencing token, `ARGV[4]`
/// `1` to queue up when busy, `ARGV[5]` the publish command (`PUBLISH`, or `SPUBLISH` in a
/// cluster), `ARGV[6]` a semaphore's size, or `read` for a reader (`0` or absent: the lock
/// itself, also a read-write lock's write side), `ARGV[7]` the number of the caller's attempt,
/// which names its place in the queue. With the lock alone, or the lock and its
/// counter, as `KEYS`, there is no queue:
/// Redlock, `confirm_replicas`, and a cluster slot in migration (where Redis refuses a script
/// whose keys are not all on one node) use it that way. Used after a plain `SET NX PX` was
/// refused, and with fencing.
///
/// Returns `{1, fence}` when acquired (fence 0 without fencing), `{0, pttl, owner}` when busy (the
/// holder's remaining lease and token), `{2, type}` when the key holds something that is not a
/// lock. A retry with the same token after a lost reply, or after the lock was handed to this
/// waiter, finds its own token and takes the lock again instead of waiting for itself. The
/// counter is incremented in the same script as the `SET`, so no holder can ever see an older
/// token than a previous holder.
///
/// A free lock goes to the oldest live waiter: to the caller if that is it (or if nobody
/// waits), else it is handed over as [`RELEASE_LUA`] does and the caller queues up behind. A
/// busy caller that asked to queue takes (or keeps, renewing its deadline) its place: waiting
/// is first come, first served, and each attempt while waiting renews the place.
///
/// Readers and semaphores (`ARGV[6]` = `read` or N) keep a sorted set under the key: each
/// holder's token scored by its deadline (server clock, ms), and one member scored `+inf` that
/// says what the set is, `#read` or `#permits=N`. A place is taken (`{1, 0}`) when, after
/// expired holders are dropped, fewer than N remain (readers: any number) and no waiter for the
/// whole lock is queued (a free set goes to such a waiter first); else `{0, ms until the soonest
/// deadline, tag}`. A set of another kind or size answers `{3, its tag}` and is left untouched;
/// a string (a lock, or a writer) answers busy with its holder. The key expires with its last
/// deadline. The lock itself (a writer) treats such a set as busy and queues behind it, which
/// stops new readers and permit takers until it has had its turn.
///
/// The counter expires a day after the last fenced acquisition, so per-entity keys
/// do not pile up. A missing counter (new, expired, deleted or lost with the server's data)
/// starts at the server's clock in microseconds (`TIME`): an old counter started at its own
/// clock reading and grew by one per fenced acquisition, far less than one per microsecond, so
/// the restarted one begins above every token it handed out, as long as this server's clock is
/// not behind the old one's by more than the time since the old counter was last used. Lua
/// numbers are doubles, exact to 2^53: microseconds since 1970 stay below that until 2255.
pub const ACQUIRE_LUA: &str = concat!(
    queue_lua!(),
    r"
local token, ttl = ARGV[1], ARGV[2]
if ARGV[6] and ARGV[6] ~= '0' then
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind == 'string' then return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])} end
  if kind ~= 'zset' and kind ~= 'none' then return {2, kind} end
  local limit = tonumber(ARGV[6]) or math.huge
  local tag = limit == math.huge and '#read' or '#permits=' .. ARGV[6]
  local now = now_ms()
  if kind == 'zset' then
    local found = shared_tag_of(KEYS[1])
    if not found then return {2, kind} end
    if settle_shared(now) and found ~= tag then return {3, found} end
  end
  if not redis.call('ZSCORE', KEYS[1], token) then
    local held = math.max(redis.call('ZCARD', KEYS[1]) - 1, 0)
    local head, head_deadline = oldest_live_place()
    if held == 0 and head then
      local waiter, waiter_deadline, fencing, place = oldest_live_waiter()
      hand_over(waiter, waiter_deadline, fencing, place, '', ARGV[5])
      return {0, waiter_deadline - now, waiter}
    end
    if head or held >= limit then
      local wait = math.huge
      if held > 0 then
        wait = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
      end
      if head then wait = math.min(wait, head_deadline - now) end
      return {0, math.max(wait, 0), tag}
    end
  end
  redis.call('ZADD', KEYS[1], now + tonumber(ttl), token, '+inf', tag)
  settle_shared(now)
  leave_queue(token)
  return {1, 0}
end
if #KEYS < 4 or redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl) then return {1, take_fence(ARGV[3])} end
end
local owner = redis.pcall('GET', KEYS[1])
if type(owner) == 'table' then
  local kind = redis.call('TYPE', KEYS[1]).ok
  owner = kind == 'zset' and shared_tag_of(KEYS[1])
  if not owner then return {2, kind} end
  if not settle_shared(now_ms()) then owner = false end
end
if owner == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  leave_queue(token)
  return {1, take_fence(ARGV[3])}
end
if not owner then
  local waiter, waiter_deadline, fencing, place = oldest_live_waiter()
  if not waiter or waiter == token then
    leave_queue(token)
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    return {1, take_fence(ARGV[3])}
  end
  hand_over(waiter, waiter_deadline, fencing, place, '', ARGV[5])
  owner = waiter
end
if ARGV[4] == '1' and #KEYS >= 4 then
  if not redis.call('ZSCORE', KEYS[3], token) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, token)
  end
  local entry = string.format('%d %s %s %s', now_ms() + tonumber(ttl), ttl, ARGV[3], ARGV[7] or '0')
  redis.call('HSET', KEYS[4], token, entry)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < tonumber(ttl) then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end
return {0, redis.call('PTTL', KEYS[1]), owner}
"
);

/// A multi-key lock: `KEYS[1..n]` the locks (sorted), then with fencing `KEYS[n+1..2n]` their
/// counters; `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to take a fencing token, `ARGV[4]`
/// n. All or none: every key free (or already this token's) is set to the token with the ttl;
/// else nothing is written and the reply is `{0, pttl, owner, i}` for the first taken key `i`
/// (a reader's or permit's set reads as taken, by its tag), or `{2, type, i}` for a key that
/// holds application data. Taken, it replies `{1, fence}`: with fencing, the next token of
/// every key's counter (as [`ACQUIRE_LUA`] takes one), the highest of them, and every counter
/// raised to it, so the token is above each key's earlier tokens and a later holder of any of
/// them gets a higher one. It does not queue, and takes free keys even where single-key
/// waiters are queued (a key with waiters is free only after its holder's lease ran out).
pub const ACQUIRE_ALL_LUA: &str = concat!(
    common_lua!(),
    r"
local token, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[4])
for i = 1, n do
  local owner = redis.pcall('GET', KEYS[i])
  if type(owner) == 'table' then
    local kind = redis.call('TYPE', KEYS[i]).ok
    local tag = kind == 'zset' and shared_tag_of(KEYS[i])
    if not tag then return {2, kind, i} end
    return {0, redis.call('PTTL', KEYS[i]), tag, i}
  end
  if owner and owner ~= token then return {0, redis.call('PTTL', KEYS[i]), owner, i} end
end
for i = 1, n do redis.call('SET', KEYS[i], token, 'PX', ttl) end
if ARGV[3] ~= '1' then return {1, 0} end
local fence = 0
for i = n + 1, 2 * n do
  local next = next_fence(KEYS[i])
  if next > fence then fence = next end
end
for i = n + 1, 2 * n do
  redis.call('SET', KEYS[i], string.format('%d', fence), 'PX', '86400000')
end
return {1, fence}
"
);

/// [`ACQUIRE_ALL_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_ALL_LUA));

/// [`ACQUIRE_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

/// `KEYS` as for [`ACQUIRE_LUA`]; `ARGV[1]` token, `ARGV[2]` the publish command. Lets go of
/// the token: takes it out of the waiters' queue, and if it holds the lock, hands the lock to
/// the oldest live waiter or deletes it; of readers or a semaphore (a sorted set, see
/// [`ACQUIRE_LUA`]), removes the token's place, and with the last live one gone deletes the set
/// and hands the lock to the oldest live waiter if any. A waiter for the whole lock that leaves
/// the queue of a shared or free key publishes, so whoever it held off may enter. `pcall` so a key of another type reads as "not ours" instead
/// of an error. Returns 1 when the lock was deleted, 2 when it was handed over, 0 when
/// it was not ours.
///
/// It publishes on the lock's channel: `<released>` when the lock is now free, and
/// `<released>:<next>:<fence>:<place>` when it went to a waiter, where each name is the SHA-1 of
/// a token (it names a tenure without handing out the token itself), the fence is the new
/// holder's fencing token (0 without fencing) and the place the waiter's attempt that kept the
/// place the lock went to (a waiter trusts a handoff only for a place no later attempt of its
/// own found taken). The waiter learns from the message alone that it holds the
/// lock, and others that it is not free. A release that several Redlock nodes publish wakes one
/// waiter per process, not one per node.
pub const RELEASE_LUA: &str = concat!(
    queue_lua!(),
    r"
local owner = redis.pcall('GET', KEYS[1])
local shared = type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1])
if shared or owner ~= ARGV[1] then
  local left = leave_queue(ARGV[1])
  local released = shared and release_permit(ARGV[1], ARGV[2]) or 0
  if left and released == 0 and (shared or not owner) then
    -- A waiter for the whole lock left: whoever it held off (readers, permit takers) may enter.
    redis.call(ARGV[2], KEYS[1], redis.sha1hex(ARGV[1]))
  end
  return released
end
local released = redis.sha1hex(ARGV[1])
if #KEYS >= 4 and redis.call('EXISTS', KEYS[3]) == 1 then
  leave_queue(ARGV[1])
  local waiter, deadline, fencing, place = oldest_live_waiter()
  if waiter then
    hand_over(waiter, deadline, fencing, place, released, ARGV[2])
    return 2
  end
end
redis.call(ARGV[2], KEYS[1], released)
redis.call('DEL', KEYS[1])
return 1
"
);

/// [`RELEASE_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// `KEYS[1]` lock; `ARGV[1]` token. [`RELEASE_LUA`] without the notification: it takes back a
/// Redlock attempt that won only a minority of nodes. Nobody waits for such an attempt to end
/// (no one saw it hold a quorum), and telling them would wake waiters for nothing.
pub const UNDO_LUA: &str = concat!(
    common_lua!(),
    r"
local owner = redis.pcall('GET', KEYS[1])
if owner == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1]) then
  local taken = redis.call('ZREM', KEYS[1], ARGV[1])
  if taken == 1 and redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf') == 0 then
    redis.call('DEL', KEYS[1])
  end
  return taken
end
return 0
"
);

/// [`UNDO_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static UNDO: LazyLock<Script> = LazyLock::new(|| Script::new(UNDO_LUA));

/// `KEYS` locks; `ARGV` token and ttl ms for each key in turn. One script call renews a whole
/// batch: the keeper sends one command per batch instead of one per lock. Returns per key 1
/// (renewed), 0 (no such key: expired or deleted; of a semaphore: no live permit of ours) or -1
/// (someone else's value); a lock that is no longer ours is never touched. A permit's deadline
/// moves to now + ttl, and the set's expiry to its last live deadline.
pub const RENEW_LUA: &str = concat!(
    common_lua!(),
    r"
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if value == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  elseif value == false then
    out[i] = 0
  elseif type(value) == 'table' and redis.call('TYPE', key).ok == 'zset' then
    local ttl = tonumber(ARGV[2 * i])
    local deadline = tonumber(redis.call('ZSCORE', key, ARGV[2 * i - 1]))
    local now = now_ms()
    if not shared_tag_of(key) then
      out[i] = -1
    elseif deadline and deadline > now then
      redis.call('ZADD', key, now + ttl, ARGV[2 * i - 1])
      local last = redis.call('ZRANGE', key, -2, -2, 'WITHSCORES')[2]
      redis.call('PEXPIRE', key, math.max(tonumber(last) - now, 1))
      out[i] = 1
    else
      out[i] = 0
    end
  else
    out[i] = -1
  end
end
return out
"
);

/// [`RENEW_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

/// `KEYS[1]` lock, `KEYS[2]` fencing counter. Returns `{token or false, pttl, fence or false,
/// live places or false, tag or false}` (the last two for readers or a semaphore: the count of
/// live holders, and `#read` or `#permits=N`).
pub const INSPECT_LUA: &str = concat!(
    common_lua!(),
    r"
local token = redis.pcall('GET', KEYS[1])
local held, tag = false, false
if type(token) ~= 'string' then
  token = false
  if redis.call('TYPE', KEYS[1]).ok == 'zset' then
    held = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '(+inf')
    tag = shared_tag_of(KEYS[1]) or false
  end
end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), held, tag}
"
);

/// [`INSPECT_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

/// `KEYS[1]` lock; `ARGV[1]` the publish command. Deletes whatever lock is there (an operator's
/// decision) and wakes waiters, naming the tenure as [`RELEASE_LUA`] does.
pub const FORCE_UNLOCK_LUA: &str = concat!(
    common_lua!(),
    r"
local kind = redis.call('TYPE', KEYS[1]).ok
local tenure
if kind == 'string' then
  tenure = redis.call('GET', KEYS[1])
elseif kind == 'zset' then
  tenure = shared_tag_of(KEYS[1])
  if not tenure then return 0 end
else
  return 0
end
redis.call(ARGV[1], KEYS[1], redis.sha1hex(tenure))
redis.call('DEL', KEYS[1])
return 1
"
);

/// [`FORCE_UNLOCK_LUA`], ready to invoke (by SHA, loading it on `NOSCRIPT`).
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));

/// `EVALSHA` of `script` with `keys` keys; the caller adds the keys, then the arguments.
pub(crate) fn evalsha(script: &redis::Script, keys: usize) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Every script, for loading them all when a connection opens.
pub(crate) const ALL: [&str; 7] = [
    ACQUIRE_LUA,
    ACQUIRE_ALL_LUA,
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
