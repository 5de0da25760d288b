-- Demote, one slice. KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative ZSET. ARGV[1]: endpoint;
-- ARGV[2]: ttl ms; ARGV[3]: block-key name prefix (same hash tag); ARGV[4]: the most blocks this call
-- visits. Pops up to ARGV[4] block IDs off the reverse SET and turns the endpoint's tier bits in those
-- blocks into an unconfirmed (speculative) hold expiring ttl from now (or later, if a live hold already
-- does). Returns how many members the reverse SET still holds (the caller repeats the call until 0).
local ep, exp, pfx, n = ARGV[1], now + tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local ids = redis.call('SPOP', KEYS[1], n)
local names = {}
for i, id in ipairs(ids) do names[i] = pfx .. id end
local z = {}
update(names, 1, ep, function(v, i)
  if not v then return nil end
  v = live(v)
  local tiers = v % 4
  if tiers == 0 then return v end
  local e = math.max(exp, (v - tiers) / 4)
  z[#z + 1] = e; z[#z + 1] = ids[i]
  return e * 4
end)
for c = 1, #z, 1000 do redis.call('ZADD', KEYS[2], unpack(z, c, math.min(c + 999, #z))) end
return redis.call('SCARD', KEYS[1])
