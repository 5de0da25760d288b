-- ClearConfirmed, one slice. KEYS[1]: the endpoint's reverse SET; KEYS[2]: its speculative ZSET (scores:
-- expiry in ms). ARGV[1]: endpoint; ARGV[2]: block-key name prefix (same hash tag); ARGV[3]: the most blocks
-- this call visits; ARGV[4]: ms after now up to which a live speculative hold is kept. Pops up to ARGV[3]
-- block IDs off the reverse SET and drops the endpoint's tier bits from those blocks, keeping live
-- speculative holds that expire within ARGV[4] (those blocks stay in its speculative ZSET); then, with room
-- left, drops the holds that expire later (a routed hit's refresh, a demoted entry) and their ZSET members.
-- Returns how many members are still to visit (the caller repeats the call until 0).
local ep, pfx, n, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), now + tonumber(ARGV[4])
local names = {}
for _, id in ipairs(redis.call('SPOP', KEYS[1], n)) do names[#names + 1] = pfx .. id end
local long = {}
if #names < n then
  long = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. num(keep), '+inf', 'LIMIT', 0, n - #names)
  for _, id in ipairs(long) do names[#names + 1] = pfx .. id end
end
update(names, 1, ep, function(v)
  if not v then return nil end
  v = live(v)
  if (v - v % 4) / 4 > keep then return nil end
  return v - v % 4
end)
if #long > 0 then redis.call('ZREM', KEYS[2], unpack(long)) end
return redis.call('SCARD', KEYS[1]) + redis.call('ZCOUNT', KEYS[2], '(' .. num(keep), '+inf')
