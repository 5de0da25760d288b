-- Fence prologue (layout v1) of the fenced index writes: the last key is the fence STRING of the writer's
-- lease scope (<base>{<model>}:f:<scope>, same hash tag), the last argument the writer's fencing token.
-- Both are taken off KEYS and ARGV, so the write script that follows sees its usual layout. Only
-- RaiseFence (scripts/index_fence_raise.lua) sets the fence; a write whose token is not the recorded one is
-- refused (error reply "FENCED ..."), before anything is written. With no fence recorded (a Redis
-- restarted empty) writes pass: a stale holder's token from before the restart must not set it.
local fk, ftok = table.remove(KEYS), table.remove(ARGV)
local fcur = redis.call('GET', fk)
if fcur and fcur ~= ftok then
  return redis.error_reply('FENCED token ' .. tostring(ftok) .. ' is not the current holder\'s ' .. fcur)
end
