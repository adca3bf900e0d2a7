-- Renews every lease of a keeper's batch (after prelude.lua; its call and reply: renew.rs).
-- KEYS: the locks, then the fencing counter of each fenced one, in the same order.
-- ARGV: for each lock, its holder's token, the ttl in ms, its fence (`0`: not fenced) and how
-- long it has been held in ms, to be noted beside it (`-`: not this time).
-- A renewal that notes it writes the note (see held_key in prelude.lua) when there is none of
-- the holder's, else keeps it: either way for HELD_NOTE_TTLS ttls, so native renewals (Valkey's
-- `SET .. IFEQ`) in between need not touch it. Anything there that is not a note (another
-- type, a string no script wrote) is left alone, and the lock goes without.
local function note_held(key, token, held, ttl)
  local at = held_key(key)
  if not may_touch('SET', at, '') then return end
  local keep = string.format('%d', tonumber(ttl) * HELD_NOTE_TTLS)
  local tenure = redis.sha1hex(token)
  local since, writable = held_since(at, tenure)
  if since then
    redis.pcall('PEXPIRE', at, keep)
  elseif writable then
    local note = tenure .. ' ' .. string.format('%d', now_ms() - tonumber(held))
    redis.pcall('SET', at, note, 'PX', keep)
  end
end
local out, n, counters = {}, #ARGV / 4, 0
for i = 1, n do
  local key, token, ttl, fence, held = KEYS[i], ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i]
  local value = redis.pcall('GET', key)
  if holder_of(value) == token then
    out[i] = redis.call('PEXPIRE', key, ttl)
    if held ~= '-' then note_held(key, token, held, ttl) end
  elseif value == false then
    out[i] = 0
  elseif type(value) == 'table' and redis.call('TYPE', key).ok == 'zset' then
    local deadline = tonumber(redis.call('ZSCORE', key, token))
    local now = now_ms()
    if not shared_tag_of(key) then
      out[i] = -1
    elseif deadline and deadline > now then
      redis.call('ZADD', key, now + tonumber(ttl), token)
      local last = redis.call('ZRANGE', key, -2, -2, 'WITHSCORES')[2]
      redis.call('PEXPIRE', key, math.max(tonumber(last) - now, 1))
      out[i] = 1
    else
      out[i] = 0
    end
  else
    out[i] = -1
  end
  if fence ~= '0' then
    counters = counters + 1
    if out[i] == 1 then hold_fence(KEYS[n + counters], fence, ttl) end
  end
end
return out
