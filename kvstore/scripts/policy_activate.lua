-- Activate. ARGV[3]: model; ARGV[4]: entry; ARGV[5]: its version; ARGV[6]: '1' when the version must be a
-- stored blob; ARGV[7]: '1' to push only while the layout-1 active value equals ARGV[8] (adoption of an
-- older gateway's activation), skipping the push when the top already is the entry; ARGV[9]: max depth
-- (beyond it the oldest entry above the floor is dropped).
local k = p .. 'stack:' .. ARGV[3]
if redis.call('EXISTS', k) == 0 then return {'nostack'} end
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], ARGV[5]) == 0 then return {'noblob'} end
if ARGV[7] == '1' then
  if redis.call('HGET', p .. 'active', ARGV[3]) ~= ARGV[8] then return {'stale'} end
  if redis.call('LINDEX', k, -1) == ARGV[4] then return stack_reply(k) end
end
if redis.call('RPUSH', k, ARGV[4]) > tonumber(ARGV[9]) then
  local floor = redis.call('LPOP', k)
  redis.call('LSET', k, 0, floor)
end
set_top(ARGV[3], k)
redis.call('PUBLISH', channel, 'stack:' .. ARGV[3])
return stack_reply(k)
