-- kvgate index clear endpoint (layout v1). KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative
-- ZSET. ARGV[1]: endpoint; ARGV[2]: block-key name prefix (same hash tag). Touches only this endpoint's keys.
local ep, pfx = ARGV[1], ARGV[2]
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do redis.call('HDEL', pfx .. id, ep) end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do redis.call('HDEL', pfx .. id, ep) end
redis.call('DEL', KEYS[1], KEYS[2])
return 0
