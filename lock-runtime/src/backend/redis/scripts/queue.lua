-- What acquire.lua, release.lua and inspect.lua share after the prelude: taking a fencing
-- token, and handing the lock to the oldest live waiter.
-- KEYS (the calling script's): [1] the lock, [2] its fencing counter, [3] its waiters' queue,
--   [4] their places; called with [1] or [1] and [2] alone, there is no queue to serve.
--
-- The waiters' queue is two keys beside the lock, in its slot: `queue:...` (a sorted set of
-- waiters' tokens, scored by arrival) and `queued:...` (a hash from each token to
-- "<deadline ms> <ttl ms> <fencing 0|1> <place>", the deadline on the server's clock, the place
-- the number of the waiter's attempt that last kept it, followed by " aside" while the waiter
-- stands aside: an election's candidate that keeps its place but must not lead now, passed
-- over by every handoff; and the note of `note_unqueued`). A
-- waiter whose deadline has passed (it stopped renewing its place: gone, or gave up without
-- saying so) is dropped when it reaches the head, never handed the lock. A handed lock expires
-- with the place it went to, so a waiter that died in the queue holds it no longer than its
-- place had left.
--
-- A script checks the keys it shares with the others (counter, queue, hash) and the caller's
-- right to publish before it writes anything (`corrupt_shared_key`, `publish_refused`): a key
-- that holds what no script wrote, or a user whose ACL lacks the publish command, gets the
-- refusal with nothing changed (no lock, counter or queue).
-- The refusal, before anything is written, of a caller whose ACL lacks the publish command
-- (Redis and Valkey 7+ can ask; where they cannot, the command itself refuses, later).
local function publish_refused(publish)
  if redis.acl_check_cmd and not redis.acl_check_cmd(publish, KEYS[1], '') then
    return redis.error_reply(
      "NOPERM this user has no permissions to run the '" .. string.lower(publish) .. "' command")
  end
  return nil
end
local function corrupt_shared_key()
  if #KEYS >= 2 then
    local found = bad_counter(KEYS[2])
    if found then return corrupt('counter', found, KEYS[2]) end
  end
  if #KEYS >= 4 then
    local queue, queued = redis.call('TYPE', KEYS[3]).ok, redis.call('TYPE', KEYS[4]).ok
    if queue ~= 'none' and queue ~= 'zset' then return corrupt('queue', queue, KEYS[3]) end
    if queued ~= 'none' and queued ~= 'hash' then return corrupt('queued', queued, KEYS[4]) end
  end
  return nil
end
local function take_fence(wanted, ttl)
  if wanted ~= '1' then return 0 end
  local fence = next_fence(KEYS[2])
  keep_fence(KEYS[2], fence, ttl)
  return fence
end
-- The fence of a holder whose attempt finds its own token (its reply was lost, or a handoff came
-- while the attempt was on its way): the one it was given, still the counter's, since nobody else
-- took the lock since. Its tenure goes on; a new fence would only skip the one it was handed.
local function own_fence(wanted, ttl)
  if wanted ~= '1' then return 0 end
  local fence = tonumber(redis.call('GET', KEYS[2]))
  if not fence then return take_fence(wanted, ttl) end
  keep_fence(KEYS[2], fence, ttl)
  return fence
end
local function leave_queue(token)
  if #KEYS < 4 or redis.call('ZREM', KEYS[3], token) == 0 then return false end
  redis.call('HDEL', KEYS[4], token)
  return true
end
-- A caller that waits without a place in the queue (a reader or permit taker) leaves a note in
-- the queue's hash, kept at least as long as the lock's lease: a handoff wakes only the waiter
-- it went to, so until a release frees the lock and tells the others, whoever the lock is
-- handed to is marked (see prelude.lua), else its release would be a plain delete that tells
-- nobody.
local UNQUEUED = '#unqueued'
local function note_unqueued(ttl)
  if #KEYS < 4 then return end
  redis.call('HSET', KEYS[4], UNQUEUED, '1')
  local keep = math.max(tonumber(ttl), redis.call('PTTL', KEYS[1]))
  if redis.call('PTTL', KEYS[4]) < keep then redis.call('PEXPIRE', KEYS[4], keep) end
end
-- WAITED for a holder whose queue still has places in it, or whom an unqueued caller waits
-- for: its release must hand the lock over or tell the others.
local function waited_behind()
  if #KEYS < 4 then return '' end
  if redis.call('EXISTS', KEYS[3]) == 1 or redis.call('HGET', KEYS[4], UNQUEUED) then
    return WAITED
  end
  return ''
end
local function read_place(entry)
  if not entry then return nil end
  local deadline, ttl, fencing, place, rest = string.match(entry, '^(%d+) (%d+) ([01]) (%d+)(.*)$')
  if not deadline or (rest ~= '' and rest ~= ' aside') then return nil end
  return tonumber(deadline), ttl, fencing, place, rest == ' aside'
end
-- The oldest live waiter's place that may be handed the lock, found without writing: the
-- places before it that lapsed (past their deadline, or `skip`'s, a caller that is leaving),
-- then its token and deadline, or no token when there is no such place. Places standing aside
-- are passed over and kept. `drop_places` takes the lapsed ones out once the script writes.
local function oldest_live_place(skip)
  local lapsed = {}
  if #KEYS < 4 then return lapsed, nil end
  local now = now_ms()
  local at = 0
  while true do
    local head = redis.call('ZRANGE', KEYS[3], at, at)[1]
    if not head then return lapsed, nil end
    local deadline, aside = nil, false
    if head ~= skip then
      local d, _, _, _, a = read_place(redis.call('HGET', KEYS[4], head))
      deadline, aside = d, a
    end
    if not deadline or deadline <= now then
      lapsed[#lapsed + 1] = head
    elseif not aside then
      return lapsed, head, deadline
    end
    at = at + 1
  end
end
local function oldest_live_waiter(skip)
  local before, head = oldest_live_place(skip)
  if not head then return before, nil end
  local deadline, _, fencing, place = read_place(redis.call('HGET', KEYS[4], head))
  return before, head, deadline, fencing, place
end
-- The first live place of the candidate campaigning as `identity` (a candidate's token is
-- `<identity>@<host>:<pid>:<random>`, and no host has an `@`), with what `hand_over` needs, or
-- nothing when it is not in line.
local function named_live_waiter(identity)
  if #KEYS < 4 then return nil end
  local now = now_ms()
  for _, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if string.match(waiter, '^(.*)@[^@]*$') == identity then
      local deadline, _, fencing, place, aside = read_place(redis.call('HGET', KEYS[4], waiter))
      if deadline and deadline > now and not aside then return waiter, deadline, fencing, place end
    end
  end
  return nil
end
local function drop_places(lapsed)
  for _, waiter in ipairs(lapsed) do leave_queue(waiter) end
end
-- A handoff: the lock written in the waiter's name first (a `SET`: under `maxmemory` the first
-- write of a script is the one Redis refuses, so a refused handoff changed nothing and told
-- nobody), then the counter, the queue (the lapsed places `before` the waiter, `leaving`, and
-- the waiter's) and the lock's mark, and last the message (`<released>:<next>:<fence>:<place>`):
-- a waiter is never told of a grant that was not written. A caller whose ACL lacks the publish
-- command was refused at the script's start (`publish_refused`).
local function hand_over(waiter, deadline, fencing, place, before, released, publish, leaving)
  local ttl = math.max(deadline - now_ms(), 1)
  redis.call('SET', KEYS[1], waiter, 'PX', ttl)
  local fence = 0
  if fencing == '1' then
    fence = next_fence(KEYS[2])
    keep_fence(KEYS[2], fence, ttl)
  end
  drop_places(before)
  if leaving then leave_queue(leaving) end
  leave_queue(waiter)
  local value = waiter .. waited_behind()
  if value ~= waiter then redis.call('SET', KEYS[1], value, 'KEEPTTL') end
  local next = redis.sha1hex(waiter) .. ':' .. string.format('%d', fence) .. ':' .. place
  redis.call(publish, KEYS[1], released .. ':' .. next)
  return value
end
local function settle_shared(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) <= 1 then
    redis.call('DEL', KEYS[1])
    return false
  end
  local last = redis.call('ZRANGE', KEYS[1], -2, -2, 'WITHSCORES')[2]
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last) - now, 1))
  return true
end
-- Live places of a reader's or permit's set, counted without writing.
local function live_shared(now)
  return redis.call('ZCOUNT', KEYS[1], '(' .. now, '(+inf')
end
local function release_permit(token, publish)
  local deadline = tonumber(redis.call('ZSCORE', KEYS[1], token))
  if not deadline then return 0 end
  local now = now_ms()
  local ours = deadline > now
  local released = redis.sha1hex(token)
  local before = {}
  if live_shared(now) <= (ours and 1 or 0) then
    local waiter, waiter_deadline, fencing, place
    before, waiter, waiter_deadline, fencing, place = oldest_live_waiter(token)
    if waiter then
      hand_over(waiter, waiter_deadline, fencing, place, before, released, publish, token)
      return ours and 2 or 0
    end
  end
  redis.call(publish, KEYS[1], released)
  redis.call('ZREM', KEYS[1], token)
  settle_shared(now)
  drop_places(before)
  return ours and 1 or 0
end
