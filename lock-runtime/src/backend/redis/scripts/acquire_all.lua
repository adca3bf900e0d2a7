local token, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[4])
-- Every counter is checked before any key is written (see `corrupt` in prelude.lua).
if ARGV[3] == '1' then
  for i = n + 1, 2 * n do
    local found = bad_counter(KEYS[i])
    if found then return corrupt('counter', found, KEYS[i]) end
  end
end
local values = {}
for i = 1, n do
  local value = redis.pcall('GET', KEYS[i])
  local owner = holder_of(value)
  if type(owner) == 'table' then
    local kind = redis.call('TYPE', KEYS[i]).ok
    local tag = kind == 'zset' and shared_tag_of(KEYS[i])
    if not tag then return {2, kind, i} end
    return {0, redis.call('PTTL', KEYS[i]), tag, i}
  end
  if owner and owner ~= token then
    if ARGV[5] == '1' then mark_waited(KEYS[i], value) end
    return {0, redis.call('PTTL', KEYS[i]), owner, i}
  end
  values[i] = value or (ARGV[6] == '1' and token .. WAITED or token)
end
-- A key already ours keeps its value: marked, its release still wakes who waited.
for i = 1, n do redis.call('SET', KEYS[i], values[i], 'PX', ttl) end
if ARGV[3] ~= '1' then return {1, 0} end
local fence = 0
for i = n + 1, 2 * n do
  local next = next_fence(KEYS[i])
  if next > fence then fence = next end
end
for i = n + 1, 2 * n do keep_fence(KEYS[i], fence, ttl) end
return {1, fence}
