-- kvgate index (layout v1), shared prologue. A block is a STRING of records "<endpoint>\t<v>\n", where
-- v = expiresMs*4 + tier bits (1 GPU, 2 CPU); expiresMs > now is a live speculative hold (counts as GPU).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(v)
  if v < 1e14 then return tostring(v) end
  return string.format('%.0f', v)
end
-- find locates the record of the endpoint whose prefix is pre ("<endpoint>\t") in block string s: its first and
-- last byte (the '\n') and its value; nil, nil, nil when s is nil or holds no record of that endpoint.
local function find(s, pre)
  if not s then return nil, nil, nil end
  local p = 1
  while true do
    local i = string.find(s, pre, p, true)
    if not i then return nil, nil, nil end
    if i == 1 or string.byte(s, i - 1) == 10 then
      local j = string.find(s, '\n', i, true)
      if j then return i, j, tonumber(string.sub(s, i + #pre, j - 1)) end
      return nil, nil, nil
    end
    p = i + 1
  end
end
-- update applies f(v or nil, i) -> new v (0 or nil drops the record) to ep's record in each block key
-- keys[from..], i counting from 1. Reads with one MGET and writes with one MSET and one DEL per chunk of
-- 1000 keys; records are edited as strings (no tables per block).
local function update(keys, from, ep, f)
  local pre = ep .. '\t'
  for c = from, #keys, 1000 do
    local last = math.min(c + 999, #keys)
    local vals = redis.call('MGET', unpack(keys, c, last))
    local mset, dels = {}, {}
    for k = c, last do
      local s = vals[k - c + 1]
      local a, b, old = find(s, pre)
      local nv = f(old, k - from + 1)
      if nv ~= old and not (old == nil and (nv == nil or nv <= 0)) then
        local rec = ''
        if nv and nv > 0 then rec = pre .. num(nv) .. '\n' end
        local ns
        if a then ns = string.sub(s, 1, a - 1) .. rec .. string.sub(s, b + 1) else ns = (s or '') .. rec end
        if ns == '' then dels[#dels + 1] = keys[k] else mset[#mset + 1] = keys[k]; mset[#mset + 1] = ns end
      end
    end
    if #mset > 0 then redis.call('MSET', unpack(mset)) end
    if #dels > 0 then redis.call('DEL', unpack(dels)) end
  end
end
-- live drops an expired speculative part of v.
local function live(v)
  local tiers = v % 4
  if (v - tiers) / 4 > now then return v end
  return tiers
end
