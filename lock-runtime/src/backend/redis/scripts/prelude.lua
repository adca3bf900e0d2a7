-- The Lua every script that needs them begins with: the server's clock in milliseconds, the
-- tag that marks a sorted set as ours (readers or a semaphore, see acquire.lua; any other sorted
-- set is application data), fencing tokens (the next one, how a counter is kept, and what a
-- counter may hold), and the refusal of a key beside a lock that holds what no script wrote.
--
-- A lock's value is its holder's token, followed by WAITED once someone waited for it (a busy
-- attempt of a caller prepared to wait, or a handoff with waiters left behind). A release that
-- finds the bare token knows that nobody needs waking or handing the lock: it is a plain
-- delete (`DELIFEQ` where the server has it). Only our tokens (`host:pid:` and 32 hex digits)
-- are marked: another client's value stays as it wrote it, for its own compare-and-delete, and
-- its release through our script always hands over and notifies.
local WAITED = '+w'
local function holder_of(value)
  if type(value) == 'string' and string.sub(value, -#WAITED) == WAITED then
    return string.sub(value, 1, -#WAITED - 1)
  end
  return value
end
local function ours(value)
  return type(value) == 'string' and string.find(value, ':%d+:' .. string.rep('%x', 32) .. '$') ~= nil
end
local function mark_waited(key, value)
  if ours(value) then redis.call('SET', key, value .. WAITED, 'KEEPTTL') end
end
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function shared_tag_of(key)
  local tag = redis.call('ZRANGEBYSCORE', key, '+inf', '+inf', 'LIMIT', 0, 1)[1]
  if tag and (tag == '#read' or string.match(tag, '^#permits=%d+$')) then return tag end
  return nil
end
-- A fencing token is the greater of the counter's value plus one and the server's clock in
-- microseconds (`TIME`). So a counter that a failover rolled back (a promoted replica missed the
-- last tokens), or one that expired, was deleted or was lost, goes on above every token handed
-- out before, as long as this server's clock is not behind the clock of the server that handed
-- them out by more than the time since (a failover's duration, at least), and one key's tokens
-- come slower than one a microsecond. Lua numbers are doubles, exact to 2^53: microseconds
-- since 1970 stay below that until 2255.
local FENCE_EXPIRY_MS = '86400000'
local function next_fence(key)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  return math.max((tonumber(redis.call('GET', key)) or 0) + 1, clock)
end
-- A counter outlives the lease of the holder that last took or kept it by a day
-- (`FENCE_EXPIRY_MS` in backend/contract.rs), so per-entity counters do not pile up.
local function keep_fence(key, fence, ttl)
  local keep = tonumber(ttl) + tonumber(FENCE_EXPIRY_MS)
  redis.call('SET', key, string.format('%d', fence), 'PX', string.format('%d', keep))
end
-- What makes a counter unusable (nil: none, or a token below 2^53 - 1): another type, a string
-- that is not a token, or `exhausted`, a token at the top of the range, whose next one Lua's
-- doubles could not hold exactly (only a foreign writer can put it there before the year 2255).
local function bad_counter(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return nil end
  if kind ~= 'string' then return kind end
  local value = redis.call('GET', key)
  if #value <= 16 and string.match(value, '^%d+$') and tonumber(value) < 2^53 then
    if tonumber(value) < 2^53 - 1 then return nil end
    return 'exhausted'
  end
  return 'string'
end
-- The error that refuses a key beside a lock (`role`: counter, queue or queued) holding what no
-- script wrote (`found`): returned before the script writes anything, so nothing changes, and
-- read by backend/redis/errors.rs, which tells the caller to delete the key.
local function corrupt(role, found, key)
  return redis.error_reply('CORRUPTKEY ' .. role .. ' ' .. found .. ' ' .. key)
end
-- A held fenced lock's counter, at each renewal (renew.lua): written only when it has less than
-- half a day beyond the lease left, so it always outlives the lease (a leader's term numbers its
-- leadership for as long as it lasts), and put back at the holder's token when gone (deleted,
-- or lost), never lowered. One that holds what no script wrote is left for an acquisition to
-- refuse.
local function hold_fence(key, fence, ttl)
  if redis.call('PTTL', key) >= tonumber(ttl) + tonumber(FENCE_EXPIRY_MS) / 2 then return end
  if bad_counter(key) then return end
  keep_fence(key, math.max(tonumber(redis.call('GET', key)) or 0, tonumber(fence)), ttl)
end
-- How long a lock has been held: `since:{<key>}` (`since:<key>` when the key has a hash tag,
-- as backend names.rs names every key beside a lock), in the lock's slot, holding the SHA-1 of
-- the holder's token, a space, and the moment it took the lock on the server's clock (ms). The
-- holder's renewals write it (renew.lua), inspections read it; a note naming anyone but the
-- lock's holder says nothing. Never among a script's KEYS, and touched only where the ACL allows
-- (`may_touch`) and through `redis.pcall`: an ACL without the `since:` patterns (one written
-- before this key existed) leaves it unread and unwritten, never failing the renewal or
-- inspection around it, and logging no denial.
local HELD_NOTE_TTLS = 64
local function held_key(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then return 'since:' .. key end
  end
  return 'since:{' .. key .. '}'
end
-- Whether the ACL lets this user run `command` (args: `...`); where the server cannot say
-- (before 7.0), the command's `redis.pcall` finds out.
local function may_touch(command, ...)
  return not redis.acl_check_cmd or redis.acl_check_cmd(command, ...)
end
-- What the note at `at` (a `held_key`) says of `tenure` (the SHA-1 of a token): since when
-- (ms, server clock), or nil; and whether the key holds a note at all (anyone's) or nothing,
-- which a renewal may write over. Anything else there (another type, a string no script wrote)
-- says nothing and is left alone.
local function held_since(at, tenure)
  if not may_touch('GET', at) then return nil, false end
  local note = redis.pcall('GET', at)
  if note == false then return nil, true end
  if type(note) ~= 'string' then return nil, false end
  local noted, since = string.match(note, '^(%x+) (%d+)$')
  if not noted or #noted ~= 40 or #since > 15 then return nil, false end
  if noted ~= tenure then return nil, true end
  return tonumber(since), true
end
