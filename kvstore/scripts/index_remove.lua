-- kvgate index remove (layout v1). KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys.
-- ARGV[1]: endpoint; ARGV[2]: tier bit; ARGV[3..]: block IDs (hex). Unknown keys are ignored.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ep, bit = ARGV[1], tonumber(ARGV[2])
for i = 2, #KEYS do
  local s = redis.call('HGET', KEYS[i], ep)
  if s then
    local v = tonumber(s)
    local tiers = v % 4
    local exp = (v - tiers) / 4
    if math.floor(tiers / bit) % 2 == 1 then
      tiers = tiers - bit
      if tiers == 0 then
        redis.call('SREM', KEYS[1], ARGV[i + 1])
        if exp <= now then redis.call('HDEL', KEYS[i], ep) else redis.call('HSET', KEYS[i], ep, exp * 4) end
      else
        redis.call('HSET', KEYS[i], ep, exp * 4 + tiers)
      end
    end
  end
end
return 0
