-- kvgate reservations (layout v1), shared prologue. KEYS[1]: in-flight HASH (fields r:<ep>, t:<ep>);
-- KEYS[2]: lease ZSET (lease ID scored by expiry ms); KEYS[3]: lease data HASH (ID -> "req tok endpoint");
-- KEYS[4]: lease ID counter. Reads the server clock and drops up to 256 expired leases (each call reaps a
-- bounded slice; calls are frequent, so expired leases do not pile up).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function sub(ep, req, tok)
  local r = tonumber(redis.call('HGET', KEYS[1], 'r:' .. ep) or '0') - req
  local k = tonumber(redis.call('HGET', KEYS[1], 't:' .. ep) or '0') - tok
  if r > 0 then redis.call('HSET', KEYS[1], 'r:' .. ep, r) else redis.call('HDEL', KEYS[1], 'r:' .. ep) end
  if k > 0 then redis.call('HSET', KEYS[1], 't:' .. ep, k) else redis.call('HDEL', KEYS[1], 't:' .. ep) end
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
