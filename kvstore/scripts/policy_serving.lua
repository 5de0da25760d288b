-- ReportServing (ARGV[3] = gateway, ARGV[4] = report, ARGV[5] = ttl ms) or, with ARGV[3] = '', ListServing:
-- {(gateway, report)...}. Reports are "<base>{blobs}:serving:<gateway>" values with PX = ttl; the ZSET
-- "<base>{blobs}:gateways" (score: expiry, server clock in ms) lists them.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local z = p .. 'gateways'
redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
if ARGV[3] ~= '' then
  local ttl = tonumber(ARGV[5])
  redis.call('SET', p .. 'serving:' .. ARGV[3], ARGV[4], 'PX', ttl)
  redis.call('ZADD', z, now + ttl, ARGV[3])
  return {}
end
local out = {}
for _, gw in ipairs(redis.call('ZRANGE', z, 0, -1)) do
  local v = redis.call('GET', p .. 'serving:' .. gw)
  if v then
    out[#out + 1] = gw
    out[#out + 1] = v
  end
end
return out
