-- Record (speculative holds). KEYS[1]: the endpoint's speculative ZSET (block ID scored by expiry ms);
-- KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: ttl ms; ARGV[3]: block-key name prefix (same hash
-- tag); ARGV[4..]: block IDs (hex). First sweeps up to 128 of the endpoint's expired holds.
local ep, exp, pfx = ARGV[1], now + tonumber(ARGV[2]), ARGV[3]
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 128)
if #expired > 0 then
  local names = {}
  for i, id in ipairs(expired) do names[i] = pfx .. id end
  update(names, 1, ep, function(v) if v then return live(v) end return nil end)
  redis.call('ZREM', KEYS[1], unpack(expired))
end
local z = {}
update(KEYS, 2, ep, function(v, i)
  v = v or 0
  local tiers = v % 4
  if (v - tiers) / 4 < exp then
    z[#z + 1] = exp; z[#z + 1] = ARGV[i + 3]
    return exp * 4 + tiers
  end
  return v
end)
for c = 1, #z, 1000 do redis.call('ZADD', KEYS[1], unpack(z, c, math.min(c + 999, #z))) end
return 0
