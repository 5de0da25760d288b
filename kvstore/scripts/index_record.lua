-- Record (speculative holds). KEYS[1]: the endpoint's speculative ZSET (block ID scored by expiry ms);
-- KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: ttl ms; ARGV[3]: block-key name prefix (same hash
-- tag); ARGV[4..]: block IDs (hex). First sweeps up to 256 of the endpoint's expired holds.
local ep, exp, pfx = ARGV[1], now + tonumber(ARGV[2]), ARGV[3]
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
for _, id in ipairs(expired) do
  update(pfx .. id, ep, function(v) if v then return live(v) end return nil end)
  redis.call('ZREM', KEYS[1], id)
end
for i = 2, #KEYS do
  local grew = false
  update(KEYS[i], ep, function(v)
    v = v or 0
    local tiers = v % 4
    if (v - tiers) / 4 < exp then grew = true; return exp * 4 + tiers end
    return v
  end)
  if grew then redis.call('ZADD', KEYS[1], exp, ARGV[i + 2]) end
end
return 0
