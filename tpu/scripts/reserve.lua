-- Reserve. ARGV[1]: the request JSON (tpu.request). Mirrors tpu/place.go: validate and place before any
-- write, then write owners, lease, expiry and a new fencing token.
local q = cjson.decode(ARGV[1])
local function shapeStr(nd, s)
  if nd == 2 then return s[1] .. 'x' .. s[2] end
  return s[1] .. 'x' .. s[2] .. 'x' .. s[3]
end
local qs = q.s
local qstr = shapeStr(q.nd, qs)
if q.slice ~= '' and not spec(q.slice) then return {reaped, 'err', 'unknown_slice', 'slice ' .. q.slice} end
local ids = redis.call('HKEYS', KEYS[1])
table.sort(ids)
local floor = math.floor

local function unavail(sp, id)
  local d, hb, hg = sp.d, sp.hb, sp.hg
  local o = redis.call('HGET', KEYS[2], id)
  local mask = redis.call('HGET', KEYS[3], id)
  local u = {}
  local k = 0
  for z = 0, d[3] - 1 do for y = 0, d[2] - 1 do
    local wyz = floor(y / hb[2]) * hg[1] + floor(z / hb[3]) * hg[1] * hg[2] + 1
    for x = 0, d[1] - 1 do
      k = k + 1
      local w = floor(x / hb[1]) + wyz
      if string.sub(o, (k - 1) * W + 1, k * W) ~= ZERO or string.sub(mask, w, w) == '1' then u[k] = 1 else u[k] = 0 end
    end
  end end
  return o, u
end
local function sums(d, u)
  -- summed-volume table P over (d+1)^3 with strides 1, X, XY; P at x,y,z (0-based) is P[1 + x + y*X + z*XY]
  local X, XY = d[1] + 1, (d[1] + 1) * (d[2] + 1)
  local P = {}
  for i = 1, XY * (d[3] + 1) do P[i] = 0 end
  local k = 0
  for z = 1, d[3] do for y = 1, d[2] do
    local i = 1 + 1 + y * X + z * XY
    for x = 1, d[1] do
      k = k + 1
      P[i] = u[k] + P[i - 1] + P[i - X] + P[i - XY] - P[i - 1 - X] - P[i - 1 - XY] - P[i - X - XY] + P[i - 1 - X - XY]
      i = i + 1
    end
  end end
  return function(o, s)
    local b = 1 + o[1] + o[2] * X + o[3] * XY
    local sx, sy, sz = s[1], s[2] * X, s[3] * XY
    return P[b + sx + sy + sz] - P[b + sy + sz] - P[b + sx + sz] - P[b + sx + sy]
      + P[b + sz] + P[b + sy] + P[b + sx] - P[b]
  end
end
local function eq3(a, b) return a[1] == b[1] and a[2] == b[2] and a[3] == b[3] end
local function geometry(sp)
  if q.nd ~= sp.nd then return 'invalid_shape', qstr .. ' has another dimensionality than slice ' .. sp.id end
  local ok = false
  for _, v in ipairs(sp.vs) do if eq3(v, qs) then ok = true end end
  if not ok then return 'invalid_shape', qstr .. ' is not a ' .. sp.gen .. ' shape' end
  if eq3(qs, sp.d) then return 'use_whole_slice', qstr .. ' is all of slice ' .. sp.id end
  for i = 1, 3 do if qs[i] > sp.d[i] then return 'exceeds_parent', qstr .. ' exceeds slice ' .. sp.id .. ' (' .. sp.topo .. ')' end end
  for i = 1, 3 do if sp.d[i] % qs[i] ~= 0 then return 'invalid_shape', qstr .. ' does not tile slice ' .. sp.id end end
  if not (q.subhost and sp.single) then
    for i = 1, 3 do if qs[i] % sp.hb[i] ~= 0 then return 'below_host_granularity', qstr .. ' is below slice ' .. sp.id .. "'s host block" end end
  end
  return nil
end
local function origin(g, s, c)
  local x = c % g[1]
  local y = floor(c / g[1]) % g[2]
  local z = floor(c / (g[1] * g[2]))
  return {x * s[1], y * s[2], z * s[3]}
end
local function levels(sp, s)
  local out = {}
  for _, t in ipairs(sp.vs) do
    if not eq3(t, s) and not eq3(t, sp.d) then
      local ok = true
      for i = 1, 3 do if t[i] % s[i] ~= 0 or sp.d[i] % t[i] ~= 0 then ok = false end end
      if ok then out[#out + 1] = t end
    end
  end
  table.sort(out, function(a, b)
    local ca, cb = a[1] * a[2] * a[3], b[1] * b[2] * b[3]
    if ca ~= cb then return ca < cb end
    for i = 1, 3 do if a[i] ~= b[i] then return a[i] < b[i] end end
    return false
  end)
  return out
end
local function cmpScore(a, b)
  for i = 1, #a do
    if a[i] ~= b[i] then if a[i] > b[i] then return 1 else return -1 end end
  end
  return 0
end

-- choose
local pick = nil -- {sp, o (origin), idx, s, owners}
if q.whole then
  for _, id in ipairs(ids) do
    local sp = spec(id)
    if q.slice == '' or id == q.slice then
      if not q.any and (q.nd ~= sp.nd or not eq3(qs, sp.d)) then
        if q.slice ~= '' then return {reaped, 'err', 'invalid_shape', 'slice ' .. id .. ' is ' .. sp.topo .. ', not ' .. qstr} end
      else
        local o, u = unavail(sp, id)
        if sums(sp.d, u)({0, 0, 0}, sp.d) == 0 then
          pick = {sp = sp, o = {0, 0, 0}, idx = 0, s = sp.d, owners = o}
          break
        end
      end
    end
  end
  if not pick then return {reaped, 'err', 'no_capacity', 'no idle healthy slice of topology ' .. qstr} end
else
  local firstCode, firstMsg = nil, nil
  local eligible = false
  local bestUsed, bestFree = false, 0
  for _, id in ipairs(ids) do
    local sp = spec(id)
    if q.slice == '' or id == q.slice then
      local code, msg = geometry(sp)
      local g = {sp.d[1] / qs[1], sp.d[2] / qs[2], sp.d[3] / qs[3]}
      local count = g[1] * g[2] * g[3]
      local lo, hi = 0, count - 1
      if not code and q.hasoff then
        local t = {}
        for i = 1, 3 do
          if not code then
            if q.off[i] % qs[i] ~= 0 then code, msg = 'misaligned', 'offset is not a multiple of ' .. qstr
            elseif q.off[i] + qs[i] > sp.d[i] then code, msg = 'invalid_index', 'offset is outside slice ' .. id end
            t[i] = floor(q.off[i] / qs[i])
          end
        end
        if not code then lo = t[1] + t[2] * g[1] + t[3] * g[1] * g[2]; hi = lo end
      elseif not code and q.index >= 0 then
        if q.index >= count then code, msg = 'invalid_index', 'index ' .. q.index .. ': slice ' .. id .. ' has ' .. count .. ' ' .. qstr .. ' tiles'
        else lo, hi = q.index, q.index end
      end
      if code then
        if not firstCode then firstCode, firstMsg = code, msg end
      else
        eligible = true
        local owners, u = unavail(sp, id)
        local cnt = sums(sp.d, u)
        local busy = cnt({0, 0, 0}, sp.d)
        local free = #u - busy
        local lv = {}
        if not q.first then lv = levels(sp, qs) end
        local found, score = -1, nil
        for c = lo, hi do
          local o = origin(g, qs, c)
          if cnt(o, qs) == 0 then
            if q.first then found = c; break end
            local sc = {}
            for k, t in ipairs(lv) do
              sc[k] = cnt({floor(o[1] / t[1]) * t[1], floor(o[2] / t[2]) * t[2], floor(o[3] / t[3]) * t[3]}, t)
            end
            if found < 0 or cmpScore(sc, score) > 0 then found, score = c, sc end
          end
        end
        if found >= 0 then
          local used = busy > 0
          if q.first then
            pick = {sp = sp, o = origin(g, qs, found), idx = found, s = qs, owners = owners}
            break
          end
          if pick == nil or (used and not bestUsed) or (used == bestUsed and free < bestFree) then
            pick = {sp = sp, o = origin(g, qs, found), idx = found, s = qs, owners = owners}
            bestUsed, bestFree = used, free
          end
        end
      end
    end
  end
  if not pick then
    if not eligible and firstCode then return {reaped, 'err', firstCode, firstMsg} end
    return {reaped, 'err', 'no_capacity', 'no free ' .. qstr .. ' tile'}
  end
end

-- write
local sp = pick.sp
local token = redis.call('INCR', KEYS[6])
local kind = 'subslice'
if q.whole then kind = 'slice' end
local sub = false
for i = 1, 3 do if pick.s[i] % sp.hb[i] ~= 0 then sub = true end end
local l = {id = sp.id .. '.' .. shapeStr(sp.nd, pick.s) .. '.' .. pick.idx, slice = sp.id, kind = kind, s = pick.s,
  o = pick.o, pd = sp.d, idx = pick.idx, holder = q.holder, token = token, exp = now + q.ttl, sub = sub}
redis.call('HSET', KEYS[2], sp.id, rewrite(sp.d, pick.owners, pick.o, pick.s, nil, tok12(token)))
local j = cjson.encode(l)
redis.call('HSET', KEYS[4], l.id, j)
redis.call('ZADD', KEYS[5], l.exp, l.id)
return {reaped, 'ok', j, redis.call('HGET', KEYS[1], sp.id)}
