-- SetHealth. ARGV: slice, host, '1' healthy / '0' unhealthy.
local sp = spec(ARGV[1])
if not sp then return {reaped, 'err', 'unknown_slice', 'slice ' .. ARGV[1]} end
local w = nil
for i, h in ipairs(sp.hosts) do if h == ARGV[2] then w = i end end
if not w then return {reaped, 'err', 'invalid_argument', 'slice ' .. ARGV[1] .. ' has no host ' .. ARGV[2]} end
local m = redis.call('HGET', KEYS[3], ARGV[1])
local c = '0'
if ARGV[3] == '0' then c = '1' end
redis.call('HSET', KEYS[3], ARGV[1], string.sub(m, 1, w - 1) .. c .. string.sub(m, w + 1))
return {reaped, 'ok'}
