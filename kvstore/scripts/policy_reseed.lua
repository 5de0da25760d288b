-- Reseed. ARGV[3]: epoch; ARGV[4]: #blobs, then (name, sha256, data)...; then #stacks, then
-- (model, #entries, entries...)...; then #endpoints (-1: leave the endpoint set alone), then (id, record
-- JSON)... (the set is written whole, at revision 1). Only when no epoch marker exists: returns {marker, 1 if set here}.
local cur = redis.call('GET', p .. 'epoch')
if cur then return {cur, 0} end
redis.call('SET', p .. 'epoch', ARGV[3])
local i = 4
local nb = tonumber(ARGV[i])
i = i + 1
for _ = 1, nb do
  local name, sha, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  if redis.call('HEXISTS', KEYS[1], name) == 0 then
    redis.call('SET', p .. 'd:' .. name, data)
    redis.call('HSET', KEYS[1], name, sha)
  end
end
local ns = tonumber(ARGV[i])
i = i + 1
for _ = 1, ns do
  local m, n = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local k = p .. 'stack:' .. m
  redis.call('DEL', k)
  redis.call('RPUSH', k, unpack(ARGV, i, i + n - 1))
  i = i + n
  redis.call('SADD', p .. 'models', m)
  keep_legacy(m, k)
end
local ne = tonumber(ARGV[i])
i = i + 1
if ne >= 0 then
  redis.call('DEL', p .. 'endpoints')
  for _ = 1, ne do
    redis.call('HSET', p .. 'endpoints', ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  redis.call('SET', p .. 'endpoints:rev', 1)
  redis.call('PUBLISH', channel, 'endpoints')
end
redis.call('PUBLISH', channel, 'fleet:reseeded')
return {ARGV[3], 1}
