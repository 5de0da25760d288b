-- kvgate index add (layout v1). KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys.
-- ARGV[1]: endpoint; ARGV[2]: tier bit (1 GPU, 2 CPU); ARGV[3..]: block IDs (hex), one per block key.
local ep, bit = ARGV[1], tonumber(ARGV[2])
for i = 2, #KEYS do
  local v = tonumber(redis.call('HGET', KEYS[i], ep) or '0')
  local tiers = v % 4
  if math.floor(tiers / bit) % 2 == 0 then
    redis.call('HSET', KEYS[i], ep, v + bit)
  end
  redis.call('SADD', KEYS[1], ARGV[i + 1])
end
return #KEYS - 1
