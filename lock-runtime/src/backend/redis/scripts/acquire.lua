-- Takes a lock, a reader's place or a permit, and queues a busy caller that waits (after
-- prelude.lua and queue.lua; its call and reply: acquire.rs).
-- KEYS: [1] the lock, [2] its fencing counter, [3] its waiters' queue (`queue:`), [4] their
--   places (`queued:`); only [1] or [1] and [2] where there is no queue (Redlock,
--   `confirm_replicas`, a slot in migration).
-- ARGV: [1] the caller's token, [2] the ttl in ms, [3] `1` to take a fencing token, [4] `1` to
--   queue up when busy, [5] the publish command (`PUBLISH`, or `SPUBLISH` in a cluster), [6] a
--   semaphore's size or `read` (`0` or absent: the lock itself), [7] the number of the
--   caller's attempt (its place in the queue), [8] `1` when the caller waits if busy, [9] `1`
--   when other waiters of the caller's process wait for the lock, [10] `1` when the caller
--   stands aside (an election's candidate that must not lead now, see queue.lua): it keeps its
--   place, marked, and never takes the lock. One that finds its own token holding the lock
--   (handed to it as it stood aside, or a late copy of an attempt whose candidate has since
--   rejoined and leads) keeps it as any attempt would: the candidate decides, and a late
--   attempt never ends a term.
local token, ttl, fenced, queue_up, publish = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local share, attempt, waits, others_wait = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local aside = ARGV[10] == '1' and #KEYS >= 4
local corrupt_key = corrupt_shared_key()
if corrupt_key then return corrupt_key end
-- Takes or keeps the caller's place for one ttl; `mark` follows the entry (' aside').
local function keep_place(mark)
  if not redis.call('ZSCORE', KEYS[3], token) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, token)
  end
  local entry = string.format('%d %s %s %s', now_ms() + tonumber(ttl), ttl, fenced, attempt or '0')
  redis.call('HSET', KEYS[4], token, entry .. mark)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < tonumber(ttl) then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end
if aside then
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind ~= 'string' and kind ~= 'none' then return {2, kind} end
  local value = redis.call('GET', KEYS[1])
  local owner = holder_of(value)
  if owner == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    leave_queue(token)
    return {1, own_fence(fenced, ttl)}
  end
  local refused = publish_refused(publish)
  if refused then return refused end
  -- The place first: every handoff below passes it over.
  keep_place(' aside')
  if not owner then
    local before, waiter, deadline, fencing, place = oldest_live_waiter()
    if waiter then
      value = hand_over(waiter, deadline, fencing, place, before, '', publish)
      owner = waiter
    else
      drop_places(before)
    end
  end
  if waits == '1' then mark_waited(KEYS[1], value) end
  return {0, redis.call('PTTL', KEYS[1]), owner}
end
-- The caller's value once it takes the lock: marked when others wait (see prelude.lua), here
-- (`others_wait`) or, where `queued` may hold anyone, in the queue.
local function taken_as(queued)
  if others_wait == '1' or (queued and waited_behind() ~= '') then return token .. WAITED end
  return token
end
if share and share ~= '0' then
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind == 'string' then
    local value = redis.call('GET', KEYS[1])
    if waits == '1' then
      mark_waited(KEYS[1], value)
      note_unqueued(ttl)
    end
    return {0, redis.call('PTTL', KEYS[1]), holder_of(value)}
  end
  if kind ~= 'zset' and kind ~= 'none' then return {2, kind} end
  local limit = tonumber(share) or math.huge
  local tag = limit == math.huge and '#read' or '#permits=' .. share
  local now = now_ms()
  local held = 0
  if kind == 'zset' then
    local found = shared_tag_of(KEYS[1])
    if not found then return {2, kind} end
    held = live_shared(now)
    if held > 0 and found ~= tag then
      settle_shared(now)
      return {3, found}
    end
  end
  local mine = tonumber(redis.call('ZSCORE', KEYS[1], token))
  if not (mine and mine > now) then
    -- A queued waiter ahead refuses this caller, whether it is handed the lock now or later.
    local before, head, head_deadline, fencing, place = oldest_live_waiter()
    if held == 0 and head then
      local refused = publish_refused(publish)
      if refused then return refused end
      if waits == '1' then note_unqueued(ttl) end
      hand_over(head, head_deadline, fencing, place, before, '', publish)
      return {0, head_deadline - now, head}
    end
    if kind == 'zset' then settle_shared(now) end
    drop_places(before)
    if head and waits == '1' then note_unqueued(ttl) end
    if head or held >= limit then
      local wait = math.huge
      if held > 0 then
        wait = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
      end
      if head then wait = math.min(wait, head_deadline - now) end
      return {0, math.max(wait, 0), tag}
    end
  end
  redis.call('ZADD', KEYS[1], now + tonumber(ttl), token, '+inf', tag)
  settle_shared(now)
  leave_queue(token)
  return {1, 0}
end
if #KEYS < 4 or redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('SET', KEYS[1], taken_as(false), 'NX', 'PX', ttl) then
    return {1, take_fence(fenced, ttl)}
  end
end
local value = redis.pcall('GET', KEYS[1])
local owner = holder_of(value)
local shared = false
if type(owner) == 'table' then
  local kind = redis.call('TYPE', KEYS[1]).ok
  owner = kind == 'zset' and shared_tag_of(KEYS[1])
  if not owner then return {2, kind} end
  -- A set whose every place ran out is free: whoever takes the lock replaces it.
  shared = live_shared(now_ms()) > 0
  if not shared then owner = false end
end
if owner == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  leave_queue(token)
  return {1, own_fence(fenced, ttl)}
end
if not owner then
  local before, waiter, waiter_deadline, fencing, place = oldest_live_waiter()
  if not waiter or waiter == token then
    drop_places(before)
    leave_queue(token)
    redis.call('SET', KEYS[1], taken_as(true), 'PX', ttl)
    return {1, take_fence(fenced, ttl)}
  end
  local refused = publish_refused(publish)
  if refused then return refused end
  value = hand_over(waiter, waiter_deadline, fencing, place, before, '', publish)
  owner = waiter
end
if shared then settle_shared(now_ms()) end
if queue_up == '1' and #KEYS >= 4 then keep_place('') end
if waits == '1' then mark_waited(KEYS[1], value) end
return {0, redis.call('PTTL', KEYS[1]), owner}
