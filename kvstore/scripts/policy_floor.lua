-- SetFloor. ARGV[3]: model; ARGV[4]: the floor entry; ARGV[5]: its version; ARGV[6]: '1' when the version
-- must be a stored blob. Creates the stack as [floor] (as SeedStack) or replaces its bottom entry; a stack of
-- one entry changes what is active, so its layout-1 value follows.
local k = p .. 'stack:' .. ARGV[3]
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], ARGV[5]) == 0 then return {'noblob'} end
if redis.call('EXISTS', k) == 0 then
  redis.call('RPUSH', k, ARGV[4])
  redis.call('SADD', p .. 'models', ARGV[3])
  keep_legacy(ARGV[3], k)
  redis.call('PUBLISH', channel, 'stack:' .. ARGV[3])
elseif redis.call('LINDEX', k, 0) ~= ARGV[4] then
  redis.call('LSET', k, 0, ARGV[4])
  if redis.call('LLEN', k) == 1 then set_top(ARGV[3], k) end
  redis.call('PUBLISH', channel, 'stack:' .. ARGV[3])
end
return stack_reply(k)
