-- Who holds a key, for how long, its last fencing token and who queues for it (after
-- prelude.lua and queue.lua; its call and reply: inspect.rs).
-- KEYS: [1] the lock, [2] its fencing counter, [3] its waiters' queue, [4] their places.
-- ARGV: none.
local corrupt_key = corrupt_shared_key()
if corrupt_key then return corrupt_key end
local token = holder_of(redis.pcall('GET', KEYS[1]))
local now = now_ms()
local tag, holders = false, {}
if type(token) ~= 'string' then
  token = false
  if redis.call('TYPE', KEYS[1]).ok == 'zset' then
    tag = shared_tag_of(KEYS[1]) or false
    local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(+inf', 'WITHSCORES')
    for i = #live - 1, 1, -2 do
      holders[#holders + 1] = live[i]
      holders[#holders + 1] = tonumber(live[i + 1]) - now
    end
  end
end
local queue, aside = {}, {}
for _, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local deadline, _, _, _, standing_aside = read_place(redis.call('HGET', KEYS[4], waiter))
  if deadline and deadline > now then
    queue[#queue + 1] = waiter
    queue[#queue + 1] = deadline - now
    if standing_aside then aside[#aside + 1] = waiter end
  end
end
local held = false
if token then
  local since = held_since(held_key(KEYS[1]), redis.sha1hex(token))
  if since then held = math.max(now - since, 0) end
end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), tag, queue, holders, aside, held}
