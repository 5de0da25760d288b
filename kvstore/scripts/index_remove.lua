-- Remove. KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: tier
-- bit; ARGV[3..]: block IDs (hex). Unknown keys are ignored.
local ep, bit = ARGV[1], tonumber(ARGV[2])
for i = 2, #KEYS do
  local left = nil
  update(KEYS[i], ep, function(v)
    if not v then return nil end
    v = live(v)
    if math.floor((v % 4) / bit) % 2 == 1 then v = v - bit end
    left = v % 4
    return v
  end)
  if left == 0 then redis.call('SREM', KEYS[1], ARGV[i + 1]) end
end
return 0
