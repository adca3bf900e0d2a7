-- Lets go of a token (then prelude.lua, queue.lua and release.lua; its call and reply:
-- release.rs).
-- KEYS: [1] the lock, [2] its fencing counter, [3] its waiters' queue, [4] their places (as
--   acquire.lua's; [1] alone where there is no queue).
-- ARGV: [1] the caller's token, [2] the publish command, [3] `1` when the token is one that
--   waiters mark (optional), [4] the identity of the candidate to hand the lock to, ahead of
--   the others, where it is in line (optional: an election's hand-over).
--
local token, publish, bare_is_silent, successor = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Before the prelude, so that it costs no more than its two commands: a lock whose value is
-- the caller's bare token, one that waiters would have marked (`bare_is_silent`, see prelude.lua),
-- was waited for by nobody, and is deleted with no look at the queue and no message.
local value = redis.pcall('GET', KEYS[1])
if bare_is_silent == '1' and value == token then
  redis.call('DEL', KEYS[1])
  return 1
end
