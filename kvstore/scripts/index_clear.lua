-- ClearEndpoint. KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative ZSET. ARGV[1]: endpoint;
-- ARGV[2]: block-key name prefix (same hash tag). Touches only this endpoint's blocks.
local ep, pfx = ARGV[1], ARGV[2]
local names = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do names[#names + 1] = pfx .. id end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do names[#names + 1] = pfx .. id end
update(names, 1, ep, function() return nil end)
redis.call('DEL', KEYS[1], KEYS[2])
return 0
