local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if holder_of(value) == ARGV[2 * i - 1] then
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
