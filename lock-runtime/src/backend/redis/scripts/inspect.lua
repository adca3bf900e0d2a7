local token = holder_of(redis.pcall('GET', KEYS[1]))
local held, tag = false, false
if type(token) ~= 'string' then
  token = false
  if redis.call('TYPE', KEYS[1]).ok == 'zset' then
    held = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '(+inf')
    tag = shared_tag_of(KEYS[1]) or false
  end
end
local waiters, now = 0, now_ms()
for _, entry in ipairs(redis.call('HVALS', KEYS[4])) do
  local deadline = read_place(entry)
  if deadline and deadline > now then waiters = waiters + 1 end
end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), held, tag, waiters}
