-- Takes every key of a multi-key lock, or none (after prelude.lua; its call and reply:
-- acquire_all.rs).
-- KEYS: [1..n] the locks (sorted), then with fencing [n+1..2n] their counters.
-- ARGV: [1] the caller's token, [2] the ttl in ms, [3] `1` to take a fencing token, [4] n,
--   [5] `1` when the caller waits if busy, [6] `1` when other waiters of the caller's process
--   wait for the lock.
local token, ttl, fenced, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local waits, others_wait = ARGV[5], ARGV[6]
-- Every counter is checked before any key is written (see `corrupt` in prelude.lua).
if fenced == '1' then
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
    if waits == '1' then mark_waited(KEYS[i], value) end
    return {0, redis.call('PTTL', KEYS[i]), owner, i}
  end
  values[i] = value or (others_wait == '1' and token .. WAITED or token)
end
-- A key already ours keeps its value: marked, its release still wakes who waited.
for i = 1, n do redis.call('SET', KEYS[i], values[i], 'PX', ttl) end
if fenced ~= '1' then return {1, 0} end
local fence = 0
for i = n + 1, 2 * n do
  local next = next_fence(KEYS[i])
  if next > fence then fence = next end
end
for i = n + 1, 2 * n do keep_fence(KEYS[i], fence, ttl) end
return {1, fence}
