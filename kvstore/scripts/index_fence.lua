-- Fence prologue (layout v1) of the fenced index writes: the last key is the fence STRING of the writer's
-- lease scope (<base>{<model>}:f:<scope>, same hash tag), the last argument the writer's fencing token.
-- Both are taken off KEYS and ARGV, so the write script that follows sees its usual layout. A token below
-- the recorded one is refused (error reply "FENCED ..."), before anything is written; a larger one is
-- recorded (the fence only rises).
local fk, ftok = table.remove(KEYS), tonumber(table.remove(ARGV))
local fcur = tonumber(redis.call('GET', fk) or '0')
if not ftok or ftok < fcur then
  return redis.error_reply('FENCED token ' .. tostring(ftok) .. ' is older than ' .. tostring(fcur))
end
if ftok > fcur then redis.call('SET', fk, ftok) end
