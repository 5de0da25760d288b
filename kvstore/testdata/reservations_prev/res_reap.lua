-- kvgate reservations (layout v1), shared prologue. KEYS[1]: in-flight HASH (fields r:<ep>, t:<ep>);
-- KEYS[2]: lease ZSET (lease ID scored by expiry ms); KEYS[3]: lease data HASH (ID -> "req tok endpoint");
-- KEYS[4]: lease ID counter. Reads the server clock and drops up to 256 expired leases (each call reaps a
-- bounded slice; calls are frequent, so expired leases do not pile up).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- One HMGET of the two counters and one HSET or HDEL of both where it can (fewer calls: each costs Redis
-- about as much as the Lua around it).
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
local function drop(id)
  local d = redis.call('HGET', KEYS[3], id)
  if d then
    local req, tok, ep = string.match(d, '^(%d+) (%d+) (.*)$')
    sub(ep, tonumber(req), tonumber(tok))
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[2], id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)) do drop(id) end
