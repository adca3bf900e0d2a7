-- Takes back what an attempt won, without a notification (after prelude.lua; its call and
-- reply: undo.rs).
-- KEYS: [1] the lock. ARGV: [1] the attempt's token.
local token = ARGV[1]
local owner = redis.pcall('GET', KEYS[1])
if holder_of(owner) == token then
  return redis.call('DEL', KEYS[1])
end
if type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1]) then
  local taken = redis.call('ZREM', KEYS[1], token)
  if taken == 1 and redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf') == 0 then
    redis.call('DEL', KEYS[1])
  end
  return taken
end
return 0
