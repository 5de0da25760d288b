-- ClearEndpoint, one slice. KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative ZSET. ARGV[1]:
-- endpoint; ARGV[2]: block-key name prefix (same hash tag); ARGV[3]: the most blocks this call visits. Pops
-- up to ARGV[3] block IDs off the reverse SET, then (room left) the speculative ZSET, and drops the
-- endpoint's records from those blocks. Returns how many members both still hold: the caller repeats the
-- call until 0, so no call runs longer than one slice whatever the endpoint holds.
local ep, pfx, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local names = {}
for _, id in ipairs(redis.call('SPOP', KEYS[1], n)) do names[#names + 1] = pfx .. id end
if #names < n then
  local z = redis.call('ZPOPMIN', KEYS[2], n - #names)
  for i = 1, #z, 2 do names[#names + 1] = pfx .. z[i] end
end
update(names, 1, ep, function() return nil end)
return redis.call('SCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
