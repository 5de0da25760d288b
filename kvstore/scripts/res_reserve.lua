-- Reserve. ARGV[1]: ttl ms; ARGV[2]: request cost; ARGV[3]: token cost (both decimal integers, as the
-- gateway formats them: they go into the lease data as they are); ARGV[4], ARGV[5]: the server time
-- window (ms, 0 = unbounded) this layout may grant in: not before ARGV[4], not at or after ARGV[5] (the
-- reservation-layout switch); then per candidate, in rank order: endpoint, max requests, max tokens
-- (0 = unlimited). Returns {lease ID, expiry ms, candidate number}, {} when every candidate is full, or
-- {'window', now} outside the window.
-- Expired leases are reaped only when a candidate does not fit (then that candidate is checked again):
-- reaping only lowers counts, so a candidate that fits with them counted fits without, and the grant is
-- the one a reap first would give, with one redis.call fewer in the common case.
local now = clock()
local ttl, req, tok = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local from, to = tonumber(ARGV[4]), tonumber(ARGV[5])
if (from > 0 and now < from) or (to > 0 and now >= to) then return {'window', now} end
local reaped = false
for i = 6, #ARGV, 3 do
  local ep, mr, mt = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local rf, tf = 'r:' .. ep, 't:' .. ep
  local v = redis.call('HMGET', KEYS[1], rf, tf)
  local r, k = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  local fits = (mr <= 0 or r + req <= mr) and (mt <= 0 or k + tok <= mt)
  if not fits and not reaped then
    reaped = true
    if reap(now) > 0 then
      v = redis.call('HMGET', KEYS[1], rf, tf)
      r, k = tonumber(v[1] or '0'), tonumber(v[2] or '0')
      fits = (mr <= 0 or r + req <= mr) and (mt <= 0 or k + tok <= mt)
    end
  end
  if fits then
    local id = tostring(redis.call('INCR', KEYS[4]))
    local exp = now + ttl
    if req > 0 and tok > 0 then
      redis.call('HSET', KEYS[1], rf, r + req, tf, k + tok)
    elseif req > 0 then
      redis.call('HSET', KEYS[1], rf, r + req)
    elseif tok > 0 then
      redis.call('HSET', KEYS[1], tf, k + tok)
    end
    redis.call('HSET', KEYS[3], id, ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ep)
    redis.call('ZADD', KEYS[2], exp, id)
    return {id, exp, (i - 3) / 3}
  end
end
return {}
