-- Unload. ARGV[3]: version. Refused ({'inuse', role, model}) while a stack has it on top, just below the
-- top or as its floor, or a layout-1 active value names it; otherwise its other stack entries are dropped
-- and its blob deleted.
local v = ARGV[3]
if redis.call('HEXISTS', KEYS[1], v) == 0 then return {'noblob'} end
local models = redis.call('SMEMBERS', p .. 'models')
table.sort(models)
local stacks = {}
for i, m in ipairs(models) do
  local s = redis.call('LRANGE', p .. 'stack:' .. m, 0, -1)
  local n = #s
  stacks[i] = s
  if n > 0 and version_of(s[n]) == v then return {'inuse', 'active', m} end
  if n > 1 and version_of(s[n - 1]) == v then return {'inuse', 'previous', m} end
  if n > 0 and version_of(s[1]) == v then return {'inuse', 'floor', m} end
end
local act = redis.call('HGETALL', p .. 'active')
local named = {}
for i = 1, #act, 2 do
  if string.find(act[i + 1], '"version":"' .. v .. '"', 1, true) then named[#named + 1] = act[i] end
end
if #named > 0 then
  table.sort(named)
  return {'inuse', 'legacy-active', named[1]}
end
for i, m in ipairs(models) do
  local keep, dropped = {}, false
  for _, e in ipairs(stacks[i]) do
    if version_of(e) == v then dropped = true else keep[#keep + 1] = e end
  end
  if dropped then
    local k = p .. 'stack:' .. m
    redis.call('DEL', k)
    redis.call('RPUSH', k, unpack(keep))
  end
end
redis.call('HDEL', KEYS[1], v)
redis.call('DEL', p .. 'd:' .. v)
redis.call('PUBLISH', channel, 'blob:' .. v)
return {'ok'}
