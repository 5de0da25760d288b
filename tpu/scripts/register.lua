-- Register. ARGV: id, slice JSON, chip count, host count.
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  if old == ARGV[2] then return {reaped, 'ok', 0} end
  return {reaped, 'err', 'slice_exists', 'slice ' .. ARGV[1] .. ' is registered with another spec: ' .. old}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], string.rep(ZERO, tonumber(ARGV[3])))
redis.call('HSET', KEYS[3], ARGV[1], string.rep('0', tonumber(ARGV[4])))
return {reaped, 'ok', 1}
