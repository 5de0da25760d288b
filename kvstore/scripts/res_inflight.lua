-- InFlight. ARGV: endpoints. Returns requests, tokens per endpoint, in ARGV order.
local out = {}
for i = 1, #ARGV do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], 'r:' .. ARGV[i]) or '0')
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], 't:' .. ARGV[i]) or '0')
end
return out
