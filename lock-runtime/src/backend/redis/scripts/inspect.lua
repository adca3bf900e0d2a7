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
