-- kvgate index layout 2, shared prologue of its few scripts (none is on the hot path: ingestion and Match
-- are plain commands). A family HASH (<base>{<family>:<model>}:h:<endpoint>) holds the endpoint's blocks
-- of one prompt family: field <8-byte block key> = one byte of tier bits (1 GPU, 2 CPU), written only by
-- the endpoint's ingester; field <8-byte block key>s = a speculative or unconfirmed hold's expiry (server
-- ms, decimal), written only by these scripts, which also set the holds marker field '~s' = '1' (Match
-- reads hold fields only in a HASH that has it); field '~' is the wide field (widen).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function ms(v) return string.format('%.0f', v) end
-- sweep samples up to 16 fields of hash k and drops the expired holds among them (bounded upkeep).
local function sweep(k)
  local r = redis.call('HRANDFIELD', k, 16, 'WITHVALUES')
  local del = {}
  for i = 1, #r, 2 do
    if #r[i] == 9 and (tonumber(r[i + 1]) or 0) <= now then del[#del + 1] = r[i] end
  end
  if #del > 0 then redis.call('HDEL', k, unpack(del)) end
end
-- widen gives hash k the wide field ('~', 65 bytes: longer than hash-max-listpack-value) once it has 32
-- fields, so Redis keeps it as a hash table (listpack lookups are linear; redis_index_v2.go: v2WideAt).
local function widen(k)
  if redis.call('HLEN', k) >= 32 and redis.call('HEXISTS', k, '~') == 0 then
    redis.call('HSET', k, '~', string.rep('-', 65))
  end
end
