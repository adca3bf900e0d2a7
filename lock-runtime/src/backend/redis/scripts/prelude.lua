-- The Lua every script that needs them begins with: the server's clock in milliseconds, the
-- tag that marks a sorted set as ours (readers or a semaphore, see acquire.lua; any other sorted
-- set is application data), and a fencing counter's next value (`INCR`, or the server's clock in
-- microseconds for a counter that starts afresh, with `true`).
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
