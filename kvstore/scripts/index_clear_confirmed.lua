-- ClearConfirmed, one slice. KEYS[1]: the endpoint's reverse SET. ARGV[1]: endpoint; ARGV[2]: block-key name
-- prefix (same hash tag); ARGV[3]: the most blocks this call visits. Pops up to ARGV[3] block IDs off the
-- reverse SET and drops the endpoint's tier bits from those blocks, keeping live speculative holds (those
-- blocks stay in its speculative ZSET). Returns how many members the reverse SET still holds (the caller
-- repeats the call until 0).
local ep, pfx, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local names = {}
for _, id in ipairs(redis.call('SPOP', KEYS[1], n)) do names[#names + 1] = pfx .. id end
update(names, 1, ep, function(v)
  if not v then return nil end
  v = live(v)
  return v - v % 4
end)
return redis.call('SCARD', KEYS[1])
