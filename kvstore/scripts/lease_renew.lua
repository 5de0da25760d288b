-- Named lease renew / release (layout v1). KEYS[1]: lease HASH. ARGV[1]: holder; ARGV[2]: token;
-- ARGV[3]: ttl ms, or "release". Returns 1 if the lease was holder's with token, else 0.
local h = redis.call('HMGET', KEYS[1], 'holder', 'token')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return 0 end
if ARGV[3] == 'release' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
