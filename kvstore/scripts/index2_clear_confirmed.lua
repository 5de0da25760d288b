-- ClearConfirmed (layout 2), one slice of one family HASH. KEYS[1]: the hash; ARGV[1]: HSCAN cursor;
-- ARGV[2]: COUNT. Deletes the confirmed fields and expired holds the scan returns; live holds stay (and
-- the wide field and the holds marker, unless nothing else is left when the scan ends).
-- Returns {next cursor, confirmed fields deleted}.
local k = KEYS[1]
local r = redis.call('HSCAN', k, ARGV[1], 'COUNT', ARGV[2])
local kv, del, n = r[2], {}, 0
for i = 1, #kv, 2 do
  local f = kv[i]
  if #f == 8 then del[#del + 1] = f; n = n + 1
  elseif #f == 9 and (tonumber(kv[i + 1]) or 0) <= now then del[#del + 1] = f end
end
if #del > 0 then redis.call('HDEL', k, unpack(del)) end
if r[1] == '0' and redis.call('HLEN', k) == redis.call('HEXISTS', k, '~') + redis.call('HEXISTS', k, '~s') then redis.call('DEL', k) end
return {r[1], n}
