-- kvgate index (layout v1), shared prologue. A block is a STRING of records "<endpoint>\t<v>\n", where
-- v = expiresMs*4 + tier bits (1 GPU, 2 CPU); expiresMs > now is a live speculative hold (counts as GPU).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function parse(s)
  local r = {}
  if s then
    for ep, v in string.gmatch(s, '([^\t\n]+)\t(%d+)\n') do r[#r + 1] = {ep, tonumber(v)} end
  end
  return r
end
local function encode(r)
  local parts = {}
  for i, e in ipairs(r) do parts[i] = e[1] .. '\t' .. string.format('%.0f', e[2]) .. '\n' end
  return table.concat(parts)
end
-- update applies f(v or nil, i) -> new v (0 or nil drops the record) to ep's record in each block key
-- keys[from..], i counting from 1. Reads with one MGET and writes with one MSET and one DEL per chunk of
-- 1000 keys.
local function update(keys, from, ep, f)
  for c = from, #keys, 1000 do
    local last = math.min(c + 999, #keys)
    local vals = redis.call('MGET', unpack(keys, c, last))
    local mset, dels = {}, {}
    for k = c, last do
      local r = parse(vals[k - c + 1])
      local pos, old = nil, nil
      for j, e in ipairs(r) do
        if e[1] == ep then pos, old = j, e[2]; break end
      end
      local nv = f(old, k - from + 1)
      if nv ~= old and not (old == nil and (nv == nil or nv <= 0)) then
        if nv and nv > 0 then
          if pos then r[pos][2] = nv else r[#r + 1] = {ep, nv} end
        else
          table.remove(r, pos)
        end
        if #r == 0 then dels[#dels + 1] = keys[k] else mset[#mset + 1] = keys[k]; mset[#mset + 1] = encode(r) end
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
