-- Demote. KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative ZSET. ARGV[1]: endpoint; ARGV[2]:
-- ttl ms; ARGV[3]: block-key name prefix (same hash tag). Turns every block the endpoint holds on a tier into
-- an unconfirmed (speculative) hold expiring ttl from now (or later, if a live hold already does). Touches only
-- this endpoint's blocks.
local ep, exp, pfx = ARGV[1], now + tonumber(ARGV[2]), ARGV[3]
local ids = redis.call('SMEMBERS', KEYS[1])
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
redis.call('DEL', KEYS[1])
return #names
