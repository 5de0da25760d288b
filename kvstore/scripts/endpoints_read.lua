-- ReadEndpoints: {marker or '', revision or 0, (id, record JSON)...}.
local out = {redis.call('GET', p .. 'epoch') or '', tonumber(redis.call('GET', p .. 'endpoints:rev') or '0')}
local all = redis.call('HGETALL', p .. 'endpoints')
for _, x in ipairs(all) do out[#out + 1] = x end
return out
