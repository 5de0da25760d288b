-- Reserve. ARGV[1]: ttl ms; ARGV[2]: request cost; ARGV[3]: token cost; then per candidate, in rank order:
-- endpoint, max requests, max tokens (0 = unlimited). Returns {lease ID, expiry ms, candidate number} or {}.
local ttl, req, tok = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 3 do
  local ep, mr, mt = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local r = tonumber(redis.call('HGET', KEYS[1], 'r:' .. ep) or '0')
  local k = tonumber(redis.call('HGET', KEYS[1], 't:' .. ep) or '0')
  if (mr <= 0 or r + req <= mr) and (mt <= 0 or k + tok <= mt) then
    local id = tostring(redis.call('INCR', KEYS[4]))
    local exp = now + ttl
    if req > 0 then redis.call('HSET', KEYS[1], 'r:' .. ep, r + req) end
    if tok > 0 then redis.call('HSET', KEYS[1], 't:' .. ep, k + tok) end
    redis.call('HSET', KEYS[3], id, string.format('%d %d %s', req, tok, ep))
    redis.call('ZADD', KEYS[2], exp, id)
    return {id, exp, (i - 1) / 3}
  end
end
return {}
