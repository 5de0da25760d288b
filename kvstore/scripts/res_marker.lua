-- The store's reservation-layout marker (kvstore/RATIONALE.md, "Reservations on Redis Cluster"). KEYS[1]:
-- the marker. ARGV[1]: delay ms; ARGV[2]: the value to restore when the marker is gone ('' = none).
-- An operator raises it with SET <marker> 2; the first reader turns that into "2 <switch ms>", the server
-- time (this master's clock) ARGV[1] from now, at which every gateway stops granting in the single-tag
-- layout and starts granting in the sharded one. A gateway that switched puts a lost marker (an empty
-- restart) back. Returns {marker value or '', server time ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
if v == '2' then
  v = string.format('2 %d', now + tonumber(ARGV[1]))
  redis.call('SET', KEYS[1], v)
elseif not v and ARGV[2] ~= '' then
  v = ARGV[2]
  redis.call('SET', KEYS[1], v)
end
return {v or '', now}
