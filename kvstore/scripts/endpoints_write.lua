-- WriteEndpoints. ARGV[3]: the revision the writer read; ARGV[4]: #put, then (id, record JSON)...; then
-- #del, then ids... Returns {'notseeded'}, {'stale', stored revision} or {'ok', ReadEndpoints' reply...}.
local cur = redis.call('GET', p .. 'endpoints:rev')
if not cur then return {'notseeded'} end
if cur ~= ARGV[3] then return {'stale', tonumber(cur)} end
local i = 4
local np = tonumber(ARGV[i])
i = i + 1
for _ = 1, np do
  redis.call('HSET', p .. 'endpoints', ARGV[i], ARGV[i + 1])
  i = i + 2
end
local nd = tonumber(ARGV[i])
i = i + 1
for _ = 1, nd do
  redis.call('HDEL', p .. 'endpoints', ARGV[i])
  i = i + 1
end
local rev = redis.call('INCR', p .. 'endpoints:rev')
redis.call('PUBLISH', channel, 'endpoints')
local out = {'ok', redis.call('GET', p .. 'epoch') or '', rev}
local all = redis.call('HGETALL', p .. 'endpoints')
for _, x in ipairs(all) do out[#out + 1] = x end
return out
