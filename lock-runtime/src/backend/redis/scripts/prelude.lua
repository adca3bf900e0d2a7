-- The Lua every script that needs them begins with: the server's clock in milliseconds, the
-- tag that marks a sorted set as ours (readers or a semaphore, see acquire.lua; any other sorted
-- set is application data), and a fencing counter's next value (`INCR`, or the server's clock in
-- microseconds for a counter that starts afresh) and how it is kept: for a day after the last
-- fenced acquisition (`FENCE_EXPIRY_MS` in backend/contract.rs), so a server re-creating an
-- expired counter may have a clock up to a day behind.
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
local FENCE_EXPIRY_MS = '86400000'
local function next_fence(key)
  local fence = redis.call('INCR', key)
  if fence ~= 1 then return fence end
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end
local function keep_fence(key, fence)
  redis.call('SET', key, string.format('%d', fence), 'PX', FENCE_EXPIRY_MS)
end
