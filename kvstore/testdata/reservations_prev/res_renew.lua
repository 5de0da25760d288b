-- Renew. ARGV[1]: lease ID; ARGV[2]: ttl ms. Returns the new expiry ms, or -1 if the lease is not live.
local id = ARGV[1]
local score = redis.call('ZSCORE', KEYS[2], id)
if not score or redis.call('HEXISTS', KEYS[3], id) == 0 then return -1 end
if tonumber(score) <= now then drop(id); return -1 end
local exp = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], exp, id)
return exp
