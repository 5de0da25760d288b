-- Shared prelude of every TPU script. KEYS (one hash tag {tpu:<pool>}, so one Cluster slot):
-- [1] slices HASH id -> slice JSON   [2] chips HASH id -> per-chip owner tokens (12 digits each, X-minor)
-- [3] health HASH id -> per-worker '0'/'1' (1 = unhealthy)   [4] leases HASH lease ID -> lease JSON
-- [5] expiry ZSET lease ID by expiry ms   [6] fence STRING counter (fencing tokens)
-- Replies start with the number of leases this call reaped, then 'ok' ... or 'err', code, message.
local W = 12
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local specs = {}
local function spec(id)
  if specs[id] == nil then
    local j = redis.call('HGET', KEYS[1], id)
    if not j then return nil end
    specs[id] = cjson.decode(j)
  end
  return specs[id]
end
local function nchips(sp) return sp.d[1] * sp.d[2] * sp.d[3] end
local function readOwners(id, n)
  local s = redis.call('HGET', KEYS[2], id)
  local o = {}
  for i = 1, n do o[i] = tonumber(string.sub(s, (i - 1) * W + 1, i * W)) end
  return o
end
local function writeOwners(id, o)
  local p = {}
  for i = 1, #o do p[i] = string.format('%012d', o[i]) end
  redis.call('HSET', KEYS[2], id, table.concat(p))
end
-- sets the chips of tile (origin o, extents s) that hold 'from' to 'to'
local function tileSet(sp, owners, o, s, from, to)
  local d = sp.d
  for z = 0, s[3] - 1 do for y = 0, s[2] - 1 do for x = 0, s[1] - 1 do
    local k = (o[1] + x) + (o[2] + y) * d[1] + (o[3] + z) * d[1] * d[2] + 1
    if from == nil or owners[k] == from then owners[k] = to end
  end end end
end
local function freeLease(l)
  local sp = spec(l.slice)
  if sp then
    local o = readOwners(l.slice, nchips(sp))
    tileSet(sp, o, l.o, l.s, l.token, 0)
    writeOwners(l.slice, o)
  end
end
local reaped = 0
for _, lid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
  local j = redis.call('HGET', KEYS[4], lid)
  if j then
    freeLease(cjson.decode(j))
    redis.call('HDEL', KEYS[4], lid)
  end
  redis.call('ZREM', KEYS[5], lid)
  reaped = reaped + 1
end
