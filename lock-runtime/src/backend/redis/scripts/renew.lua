-- Renews every lease of a keeper's batch (after prelude.lua; its call and reply: renew.rs).
-- KEYS: the locks, then the fencing counter of each fenced one, in the same order.
-- ARGV: for each lock, its holder's token, the ttl in ms and its fence (`0`: not fenced).
local out, n, counters = {}, #ARGV / 3, 0
for i = 1, n do
  local key, token, ttl, fence = KEYS[i], ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local value = redis.pcall('GET', key)
  if holder_of(value) == token then
    out[i] = redis.call('PEXPIRE', key, ttl)
  elseif value == false then
    out[i] = 0
  elseif type(value) == 'table' and redis.call('TYPE', key).ok == 'zset' then
    local deadline = tonumber(redis.call('ZSCORE', key, token))
    local now = now_ms()
    if not shared_tag_of(key) then
      out[i] = -1
    elseif deadline and deadline > now then
      redis.call('ZADD', key, now + tonumber(ttl), token)
      local last = redis.call('ZRANGE', key, -2, -2, 'WITHSCORES')[2]
      redis.call('PEXPIRE', key, math.max(tonumber(last) - now, 1))
      out[i] = 1
    else
      out[i] = 0
    end
  else
    out[i] = -1
  end
  if fence ~= '0' then
    counters = counters + 1
    if out[i] == 1 then hold_fence(KEYS[n + counters], fence, ttl) end
  end
end
return out
