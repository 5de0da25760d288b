-- Renew. ARGV: lease ID, token, ttl ms.
local j = redis.call('HGET', KEYS[4], ARGV[1])
if not j then return {reaped, 'err', 'lease_not_found', 'lease ' .. ARGV[1]} end
local l = cjson.decode(j)
if string.format('%d', l.token) ~= ARGV[2] then
  return {reaped, 'err', 'stale_token', 'lease ' .. ARGV[1] .. ': token ' .. ARGV[2] .. ' is not the live token'}
end
l.exp = now + tonumber(ARGV[3])
j = cjson.encode(l)
redis.call('HSET', KEYS[4], ARGV[1], j)
redis.call('ZADD', KEYS[5], l.exp, ARGV[1])
return {reaped, 'ok', j, redis.call('HGET', KEYS[1], l.slice)}
