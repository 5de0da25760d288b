-- ClearConfirmed (layout 2), one slice of one family HASH. KEYS[1]: the hash; ARGV[1]: ms after now up to
-- which a live hold is kept; ARGV[2]: HSCAN cursor; ARGV[3]: COUNT. Deletes the confirmed fields, expired
-- holds and holds that expire later than ARGV[1] (a routed hit's refresh, a demoted entry) the scan
-- returns; live holds within it stay (and the wide field and the holds marker, unless nothing else is left
-- when the scan ends). Returns {next cursor, confirmed fields deleted}.
local k, keep = KEYS[1], now + tonumber(ARGV[1])
local r = redis.call('HSCAN', k, ARGV[2], 'COUNT', ARGV[3])
local kv, del, n = r[2], {}, 0
for i = 1, #kv, 2 do
  local f = kv[i]
  if #f == 8 then del[#del + 1] = f; n = n + 1
  elseif #f == 9 then
    local e = tonumber(kv[i + 1]) or 0
    if e <= now or e > keep then del[#del + 1] = f end
  end
end
if #del > 0 then redis.call('HDEL', k, unpack(del)) end
if r[1] == '0' and redis.call('HLEN', k) == redis.call('HEXISTS', k, '~') + redis.call('HEXISTS', k, '~s') then redis.call('DEL', k) end
return {r[1], n}
