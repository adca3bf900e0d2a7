-- KEYS[i] held by ARGV[i], a token that waiters would have marked (see prelude.lua): deleted
-- where its value is the bare token (1), left alone otherwise (0).
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
