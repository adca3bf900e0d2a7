-- The Lua every script that needs them begins with: the server's clock in milliseconds, the
-- tag that marks a sorted set as ours (readers or a semaphore, see acquire.lua; any other sorted
-- set is application data), and a fencing counter's next value (`INCR`, or the server's clock in
-- microseconds for a counter that starts afresh) and how it is kept: for a day after the last
-- fenced acquisition (`FENCE_EXPIRY_MS` in backend/contract.rs), so a server re-creating an
-- expired counter may have a clock up to a day behind.
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
