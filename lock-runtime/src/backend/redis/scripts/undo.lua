local owner = redis.pcall('GET', KEYS[1])
if holder_of(owner) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1]) then
  local taken = redis.call('ZREM', KEYS[1], ARGV[1])
  if taken == 1 and redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf') == 0 then
    redis.call('DEL', KEYS[1])
  end
  return taken
end
return 0
