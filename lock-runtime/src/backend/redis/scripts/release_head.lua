-- Before the prelude, so that it costs no more than its two commands: a lock whose value is
-- the caller's bare token, one that waiters would have marked (ARGV[3] = '1', see prelude.lua),
-- was waited for by nobody, and is deleted with no look at the queue and no message.
local value = redis.pcall('GET', KEYS[1])
if ARGV[3] == '1' and value == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
