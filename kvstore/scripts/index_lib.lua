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
local function store(key, r)
  if #r == 0 then redis.call('DEL', key); return end
  local parts = {}
  for i, e in ipairs(r) do parts[i] = e[1] .. '\t' .. string.format('%.0f', e[2]) .. '\n' end
  redis.call('SET', key, table.concat(parts))
end
-- update applies f(v or nil) -> new v (0 or nil drops the record) to ep's record of block key.
local function update(key, ep, f)
  local r = parse(redis.call('GET', key))
  for i, e in ipairs(r) do
    if e[1] == ep then
      local nv = f(e[2])
      if nv == e[2] then return end
      if nv and nv > 0 then e[2] = nv else table.remove(r, i) end
      store(key, r)
      return
    end
  end
  local nv = f(nil)
  if nv and nv > 0 then r[#r + 1] = {ep, nv}; store(key, r) end
end
-- live drops an expired speculative part of v.
local function live(v)
  local tiers = v % 4
  if (v - tiers) / 4 > now then return v end
  return tiers
end
