-- SeedStack. ARGV[3]: model; ARGV[4]: the floor entry; ARGV[5]: its version; ARGV[6]: '1' when the version
-- must be a stored blob.
local k = p .. 'stack:' .. ARGV[3]
if redis.call('EXISTS', k) == 0 then
  if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], ARGV[5]) == 0 then return {'noblob'} end
  redis.call('RPUSH', k, ARGV[4])
  redis.call('SADD', p .. 'models', ARGV[3])
  keep_legacy(ARGV[3], k)
  redis.call('PUBLISH', channel, 'stack:' .. ARGV[3])
end
return stack_reply(k)
