local refused = corrupt_shared_key() or publish_refused(publish)
if refused then return refused end
local owner = holder_of(value)
local shared = type(owner) == 'table' and redis.call('TYPE', KEYS[1]).ok == 'zset' and shared_tag_of(KEYS[1])
if shared or owner ~= token then
  local queued = #KEYS >= 4 and redis.call('ZSCORE', KEYS[3], token)
  local released = shared and release_permit(token, publish) or 0
  if queued and released == 0 and (shared or not owner) then
    -- A waiter for the whole lock leaves: whoever it held off (readers, permit takers) may enter.
    redis.call(publish, KEYS[1], redis.sha1hex(token))
  end
  leave_queue(token)
  return released
end
local released = redis.sha1hex(token)
local before = {}
if #KEYS >= 4 and redis.call('EXISTS', KEYS[3]) == 1 then
  local waiter, deadline, fencing, place
  if successor and successor ~= '' then
    waiter, deadline, fencing, place = named_live_waiter(successor)
    if waiter then
      hand_over(waiter, deadline, fencing, place, {}, released, publish, token)
      return 3
    end
  end
  before, waiter, deadline, fencing, place = oldest_live_waiter(token)
  if waiter then
    hand_over(waiter, deadline, fencing, place, before, released, publish, token)
    return 2
  end
end
redis.call(publish, KEYS[1], released)
redis.call('DEL', KEYS[1])
if #KEYS >= 4 then
  drop_places(before)
  leave_queue(token)
  -- Told: the unqueued waiters try again, and note themselves again if refused.
  redis.call('HDEL', KEYS[4], UNQUEUED)
end
return 1
