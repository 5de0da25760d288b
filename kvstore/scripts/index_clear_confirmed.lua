-- ClearConfirmed. KEYS[1]: the endpoint's reverse SET. ARGV[1]: endpoint; ARGV[2]: block-key name prefix
-- (same hash tag). Drops the endpoint's tier bits from the blocks it holds on a tier and keeps live
-- speculative holds (those blocks stay in its speculative ZSET). Touches only this endpoint's blocks.
local ep, pfx = ARGV[1], ARGV[2]
local names = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do names[#names + 1] = pfx .. id end
update(names, 1, ep, function(v)
  if not v then return nil end
  v = live(v)
  return v - v % 4
end)
redis.call('DEL', KEYS[1])
return #names
