local kind = redis.call('TYPE', KEYS[1]).ok
local tenure
if kind == 'string' then
  tenure = holder_of(redis.call('GET', KEYS[1]))
elseif kind == 'zset' then
  tenure = shared_tag_of(KEYS[1])
  if not tenure then return 0 end
else
  return 0
end
redis.call(ARGV[1], KEYS[1], redis.sha1hex(tenure))
redis.call('DEL', KEYS[1])
return 1
