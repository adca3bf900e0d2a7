-- Deletes whatever lock is there and tells its waiters (after prelude.lua; its call and
-- reply: force_unlock.rs).
-- KEYS: [1] the lock. ARGV: [1] the publish command.
local publish = ARGV[1]
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
redis.call(publish, KEYS[1], redis.sha1hex(tenure))
redis.call('DEL', KEYS[1])
return 1
