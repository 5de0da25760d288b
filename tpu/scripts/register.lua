-- Register. ARGV: id, slice JSON, chip count, health mask (one '0' healthy / '1' unhealthy per worker),
-- holder ('' for none), lease TTL ms, lease ID. Only a new slice is written: its owners, its health and,
-- with a holder, one whole-slice lease, all in this one step (RegisterHeld).
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  if old == ARGV[2] then return {reaped, 'ok', 0} end
  return {reaped, 'err', 'slice_exists', 'slice ' .. ARGV[1] .. ' is registered with another spec: ' .. old}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
if ARGV[5] == '' then
  redis.call('HSET', KEYS[2], ARGV[1], string.rep(ZERO, tonumber(ARGV[3])))
  return {reaped, 'ok', 1}
end
local sp = cjson.decode(ARGV[2])
local token = redis.call('INCR', KEYS[6])
local l = {id = ARGV[7], slice = ARGV[1], kind = 'slice', s = sp.d, o = {0, 0, 0}, pd = sp.d, idx = 0,
  holder = ARGV[5], token = token, exp = now + tonumber(ARGV[6]), sub = false}
redis.call('HSET', KEYS[2], ARGV[1], string.rep(tok12(token), tonumber(ARGV[3])))
redis.call('HSET', KEYS[4], l.id, cjson.encode(l))
redis.call('ZADD', KEYS[5], l.exp, l.id)
return {reaped, 'ok', 1}
