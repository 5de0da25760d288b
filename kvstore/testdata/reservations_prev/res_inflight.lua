-- InFlight. ARGV: endpoints. Returns requests, tokens per endpoint, in ARGV order (HMGETs of up to 1,024
-- fields each rather than two HGETs per endpoint).
local out = {}
local f = {}
local function flush()
  if #f == 0 then return end
  for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(f))) do out[#out + 1] = tonumber(v or '0') end
  f = {}
end
for i = 1, #ARGV do
  f[#f + 1] = 'r:' .. ARGV[i]
  f[#f + 1] = 't:' .. ARGV[i]
  if #f >= 1024 then flush() end
end
flush()
return out
