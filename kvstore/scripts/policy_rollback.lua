-- Rollback. ARGV[3]: model; ARGV[4]: the version the top must name ('' for any).
local k = p .. 'stack:' .. ARGV[3]
if redis.call('EXISTS', k) == 0 then return {'nostack'} end
if ARGV[4] ~= '' and version_of(redis.call('LINDEX', k, -1)) ~= ARGV[4] then return {'stale'} end
if redis.call('LLEN', k) <= 1 then return {'noprev'} end
redis.call('RPOP', k)
set_top(ARGV[3], k)
redis.call('PUBLISH', channel, 'stack:' .. ARGV[3])
return stack_reply(k)
