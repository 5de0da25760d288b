-- Release. ARGV: lease ID, token. A lease already gone is not an error (returns 0).
local j = redis.call('HGET', KEYS[4], ARGV[1])
if not j then return {reaped, 'ok', 0} end
local l = cjson.decode(j)
if string.format('%d', l.token) ~= ARGV[2] then
  return {reaped, 'err', 'stale_token', 'lease ' .. ARGV[1] .. ': token ' .. ARGV[2] .. ' is not the live token'}
end
freeLease(l)
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return {reaped, 'ok', 1}
