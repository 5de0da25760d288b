-- Record (layout 2). KEYS[1]: the endpoint's family HASH. ARGV[1]: ttl ms; ARGV[2..]: hold fields (8-byte
-- block key .. 's'). Raises each hold to now + ttl unless it already lasts longer (and sets the holds marker
-- '~s', which tells Match to read this HASH's hold fields), then sweeps a sample.
local k, exp = KEYS[1], now + tonumber(ARGV[1])
local set = {}
for i = 2, #ARGV do
  local old = tonumber(redis.call('HGET', k, ARGV[i]) or '0') or 0
  if old < exp then set[#set + 1] = ARGV[i]; set[#set + 1] = ms(exp) end
end
if #set > 0 then set[#set + 1] = '~s'; set[#set + 1] = '1'; redis.call('HSET', k, unpack(set)); widen(k) end
sweep(k)
return 0
