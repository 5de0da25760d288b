-- Add. KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: tier bit;
-- ARGV[3..]: block IDs (hex), one per block key.
local ep, bit = ARGV[1], tonumber(ARGV[2])
update(KEYS, 2, ep, function(v)
  v = live(v or 0)
  if math.floor((v % 4) / bit) % 2 == 0 then return v + bit end
  return v
end)
for c = 3, #ARGV, 1000 do redis.call('SADD', KEYS[1], unpack(ARGV, c, math.min(c + 999, #ARGV))) end
return #KEYS - 1
