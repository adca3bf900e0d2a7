-- Releases locks nobody waited for, in one call (alone, no prelude; its call and reply:
-- release.rs).
-- KEYS: the locks. ARGV: [i] the token that holds KEYS[i], one that waiters would have marked
--   (see prelude.lua): deleted where its value is the bare token (1), left alone otherwise (0).
local released = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[i] then
    redis.call('DEL', key)
    released[i] = 1
  else
    released[i] = 0
  end
end
return released
