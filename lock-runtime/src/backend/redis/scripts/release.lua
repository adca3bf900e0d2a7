local owner = holder_of(value)
local shared = type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1])
if shared or owner ~= ARGV[1] then
  local left = leave_queue(ARGV[1])
  local released = shared and release_permit(ARGV[1], ARGV[2]) or 0
  if left and released == 0 and (shared or not owner) then
    -- A waiter for the whole lock left: whoever it held off (readers, permit takers) may enter.
    redis.call(ARGV[2], KEYS[1], redis.sha1hex(ARGV[1]))
  end
  return released
end
local released = redis.sha1hex(ARGV[1])
if #KEYS >= 4 and redis.call('EXISTS', KEYS[3]) == 1 then
  leave_queue(ARGV[1])
  local waiter, deadline, fencing, place = oldest_live_waiter()
  if waiter then
    hand_over(waiter, deadline, fencing, place, released, ARGV[2])
    return 2
  end
end
redis.call(ARGV[2], KEYS[1], released)
redis.call('DEL', KEYS[1])
-- Told: the unqueued waiters try again, and note themselves again if refused.
if #KEYS >= 4 then redis.call('HDEL', KEYS[4], UNQUEUED) end
return 1
