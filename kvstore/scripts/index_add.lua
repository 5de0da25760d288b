-- Add. KEYS[1]: the endpoint's reverse SET; KEYS[2..]: block keys. ARGV[1]: endpoint; ARGV[2]: tier bit;
-- ARGV[3..#KEYS+1]: block IDs (hex), one per block key; ARGV[#KEYS+2] (optional): the endpoint's cap (0:
-- none): past it, random members of the reverse SET are popped (at most 512 per call, so the call stays
-- short; later calls pop the rest) and the endpoint's tier bits cleared in those blocks (their names built
-- from KEYS[1]'s prefix: same hash slot). Specialized rather than built on update(): a block the
-- endpoint does not hold yet (the common case when ingesting) gets the one precomputed record appended,
-- and only blocks it held on no tier join the reverse SET (one it holds on a tier is already a member).
local ep, bit = ARGV[1], tonumber(ARGV[2])
local pre = ep .. '\t'
local fresh = pre .. ARGV[2] .. '\n'
local added = {}
for c = 2, #KEYS, 1000 do
  local last = math.min(c + 999, #KEYS)
  local vals = redis.call('MGET', unpack(KEYS, c, last))
  local mset = {}
  for k = c, last do
    local s = vals[k - c + 1]
    local a, b, old = find(s, pre)
    if not a then
      mset[#mset + 1] = KEYS[k]
      mset[#mset + 1] = s and (s .. fresh) or fresh
      added[#added + 1] = ARGV[k + 1]
    else
      local v = live(old or 0)
      local tiers = v % 4
      if tiers == 0 then added[#added + 1] = ARGV[k + 1] end
      if math.floor(tiers / bit) % 2 == 0 then v = v + bit end
      if v ~= old then
        mset[#mset + 1] = KEYS[k]
        mset[#mset + 1] = string.sub(s, 1, a - 1) .. pre .. num(v) .. '\n' .. string.sub(s, b + 1)
      end
    end
  end
  if #mset > 0 then redis.call('MSET', unpack(mset)) end
end
for c = 1, #added, 1000 do redis.call('SADD', KEYS[1], unpack(added, c, math.min(c + 999, #added))) end
local cap = tonumber(ARGV[#KEYS + 2] or '0') or 0
if cap > 0 then
  local over = math.min(redis.call('SCARD', KEYS[1]) - cap, 512)
  if over > 0 then
    local base = string.sub(KEYS[1], 1, #KEYS[1] - #ep - 2) .. 'b:'
    local gone = redis.call('SPOP', KEYS[1], over)
    local names = {}
    for i = 1, #gone do names[i] = base .. gone[i] end
    update(names, 1, ep, function(v)
      if not v then return nil end
      v = live(v)
      return v - v % 4
    end)
  end
end
return #KEYS - 1
