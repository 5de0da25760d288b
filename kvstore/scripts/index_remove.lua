-- Remove. KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: tier
-- bit; ARGV[3..]: block IDs (hex). Unknown keys are ignored.
local ep, bit = ARGV[1], tonumber(ARGV[2])
local gone = {}
update(KEYS, 2, ep, function(v, i)
  if not v then return nil end
  v = live(v)
  if math.floor((v % 4) / bit) % 2 == 1 then v = v - bit end
  if v % 4 == 0 then gone[#gone + 1] = ARGV[i + 2] end
  return v
end)
for c = 1, #gone, 1000 do redis.call('SREM', KEYS[1], unpack(gone, c, math.min(c + 999, #gone))) end
return 0
