-- RaiseFence (layout v1). KEYS[1]: the fence STRING; ARGV[1]: the new holder's token. Refused ("FENCED")
-- when a newer token is recorded; otherwise the token becomes the fence.
local cur, tok = tonumber(redis.call('GET', KEYS[1]) or '0'), tonumber(ARGV[1])
if tok < cur then return redis.error_reply('FENCED token ' .. ARGV[1] .. ' is older than ' .. cur) end
redis.call('SET', KEYS[1], ARGV[1])
return 1
