-- SeedEndpoints. ARGV[3]: #records, then (id, record JSON)... Writes the set at revision 1 unless one is
-- stored. Returns {1 if seeded here, then ReadEndpoints' reply...}.
local seeded = 0
if not redis.call('GET', p .. 'endpoints:rev') then
  redis.call('DEL', p .. 'endpoints')
  local n = tonumber(ARGV[3])
  for j = 0, n - 1 do
    redis.call('HSET', p .. 'endpoints', ARGV[4 + 2 * j], ARGV[5 + 2 * j])
  end
  redis.call('SET', p .. 'endpoints:rev', 1)
  redis.call('PUBLISH', channel, 'endpoints')
  seeded = 1
end
local out = {seeded, redis.call('GET', p .. 'epoch') or '', tonumber(redis.call('GET', p .. 'endpoints:rev'))}
local all = redis.call('HGETALL', p .. 'endpoints')
for _, x in ipairs(all) do out[#out + 1] = x end
return out
