-- ReadFleet: {epoch or '', #models, (model, #entries, entries...)..., #legacy, (model, value)...,
-- #blobs, (name, sha256, size)...}.
local out = {redis.call('GET', p .. 'epoch') or ''}
local models = redis.call('SMEMBERS', p .. 'models')
out[#out + 1] = #models
for _, m in ipairs(models) do
  local s = redis.call('LRANGE', p .. 'stack:' .. m, 0, -1)
  out[#out + 1] = m
  out[#out + 1] = #s
  for _, e in ipairs(s) do out[#out + 1] = e end
end
local act = redis.call('HGETALL', p .. 'active')
out[#out + 1] = #act / 2
for _, x in ipairs(act) do out[#out + 1] = x end
local idx = redis.call('HGETALL', KEYS[1])
out[#out + 1] = #idx / 2
for i = 1, #idx, 2 do
  out[#out + 1] = idx[i]
  out[#out + 1] = idx[i + 1]
  out[#out + 1] = redis.call('STRLEN', p .. 'd:' .. idx[i])
end
return out
