-- Named lease acquire (layout v1). KEYS[1]: lease HASH {holder, token} with a PEXPIRE (server clock);
-- KEYS[2]: fencing counter. ARGV[1]: holder; ARGV[2]: ttl ms. Returns the token, or 0 if held by another.
local h = redis.call('HMGET', KEYS[1], 'holder', 'token')
if h[1] then
  if h[1] ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(h[2])
end
local tok = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', tok)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return tok
