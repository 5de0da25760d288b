-- Demote (layout 2), one slice of one family HASH. KEYS[1]: the hash; ARGV[1]: ttl ms; ARGV[2]: HSCAN
-- cursor; ARGV[3]: COUNT. Each confirmed field the scan returns becomes a hold expiring ttl from now (or
-- later, if one already does) and is deleted; the HASH gets the holds marker '~s'. Returns {next cursor, confirmed fields demoted}.
local k, exp = KEYS[1], now + tonumber(ARGV[1])
local r = redis.call('HSCAN', k, ARGV[2], 'COUNT', ARGV[3])
local kv, set, del = r[2], {}, {}
for i = 1, #kv, 2 do
  local f = kv[i]
  if #f == 8 then
    del[#del + 1] = f
    local old = tonumber(redis.call('HGET', k, f .. 's') or '0') or 0
    if old < exp then set[#set + 1] = f .. 's'; set[#set + 1] = ms(exp) end
  end
end
if #set > 0 then set[#set + 1] = '~s'; set[#set + 1] = '1'; redis.call('HSET', k, unpack(set)) end
if #del > 0 then redis.call('HDEL', k, unpack(del)) end
return {r[1], #del}
