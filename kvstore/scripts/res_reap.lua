-- kvgate reservations (layout v1), shared library: definitions only, so a script runs only the commands it
-- needs (each redis.call costs Redis 1-2.5 µs, about as much as the command itself). KEYS[1]: in-flight
-- HASH (fields r:<ep>, t:<ep>); KEYS[2]: lease ZSET (lease ID scored by expiry ms); KEYS[3]: lease data
-- HASH (ID -> "req tok endpoint"); KEYS[4]: lease ID counter.

-- clock returns the server's time in ms (one TIME).
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- sub lowers ep's counters by req and tok: one HMGET of the two and one HSET or HDEL of both where it can.
local function sub(ep, req, tok)
  local rf, tf = 'r:' .. ep, 't:' .. ep
  local v = redis.call('HMGET', KEYS[1], rf, tf)
  local r = tonumber(v[1] or '0') - req
  local k = tonumber(v[2] or '0') - tok
  if r > 0 and k > 0 then
    redis.call('HSET', KEYS[1], rf, r, tf, k)
  elseif r <= 0 and k <= 0 then
    redis.call('HDEL', KEYS[1], rf, tf)
  elseif r > 0 then
    redis.call('HSET', KEYS[1], rf, r)
    redis.call('HDEL', KEYS[1], tf)
  else
    redis.call('HDEL', KEYS[1], rf)
    redis.call('HSET', KEYS[1], tf, k)
  end
end
-- drop removes lease id and subtracts its cost if it is still there (idempotent).
local function drop(id)
  local d = redis.call('HGET', KEYS[3], id)
  if d then
    local req, tok, ep = string.match(d, '^(%d+) (%d+) (.*)$')
    sub(ep, tonumber(req), tonumber(tok))
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[2], id)
end
-- reap drops up to 256 leases expired at now (ms; each call reaps a bounded slice) and returns how many.
local function reap(now)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
  for _, id in ipairs(ids) do drop(id) end
  return #ids
end
