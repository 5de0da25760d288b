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
local ZERO = string.rep('0', W)
local function tok12(t) return string.format('%012d', t) end
-- rewrite returns the owner string s of slice sp with the tile (origin o, extents e) set to 'to' (a 12-digit
-- token) where it holds 'from' (nil: everywhere), rebuilding only the tile's rows.
local function rewrite(d, s, o, e, from, to)
  local parts, n, pos = {}, 0, 1
  for z = 0, e[3] - 1 do for y = 0, e[2] - 1 do
    local a = ((o[1]) + (o[2] + y) * d[1] + (o[3] + z) * d[1] * d[2]) * W + 1
    n = n + 1; parts[n] = string.sub(s, pos, a - 1)
    for x = 0, e[1] - 1 do
      local b = a + x * W
      local cur = string.sub(s, b, b + W - 1)
      n = n + 1
      if from == nil or cur == from then parts[n] = to else parts[n] = cur end
    end
    pos = a + e[1] * W
  end end
  n = n + 1; parts[n] = string.sub(s, pos)
  return table.concat(parts)
end
-- frees a lease's chips (l.pd: the parent's extents, so the slice JSON need not be decoded)
local function freeLease(l)
  local s = redis.call('HGET', KEYS[2], l.slice)
  if s then
    redis.call('HSET', KEYS[2], l.slice, rewrite(l.pd, s, l.o, l.s, tok12(l.token), ZERO))
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
