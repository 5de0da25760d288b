-- kvgate index record, speculative holds (layout v1). KEYS[1]: the endpoint's speculative ZSET (block ID
-- scored by expiry ms); KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: ttl ms; ARGV[3]: block-key name
-- prefix (same hash tag); ARGV[4..]: block IDs (hex). Also sweeps up to 256 of the endpoint's expired holds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ep, exp, pfx = ARGV[1], now + tonumber(ARGV[2]), ARGV[3]
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
for _, id in ipairs(expired) do
  local k = pfx .. id
  local s = redis.call('HGET', k, ep)
  if s then
    local v = tonumber(s)
    local tiers = v % 4
    if (v - tiers) / 4 <= now then
      if tiers == 0 then redis.call('HDEL', k, ep) else redis.call('HSET', k, ep, tiers) end
    end
  end
  redis.call('ZREM', KEYS[1], id)
end
for i = 2, #KEYS do
  local v = tonumber(redis.call('HGET', KEYS[i], ep) or '0')
  local tiers = v % 4
  if (v - tiers) / 4 < exp then
    redis.call('HSET', KEYS[i], ep, exp * 4 + tiers)
    redis.call('ZADD', KEYS[1], exp, ARGV[i + 2])
  end
end
return 0
