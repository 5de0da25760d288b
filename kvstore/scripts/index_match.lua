-- Match. KEYS: the prompt's block keys in order (one hash slot). Returns {now ms, {block values...}}; the
-- prefix runs are computed by the caller. Values after the first missing block may be cut off.
if #KEYS <= 4000 then return {now, redis.call('MGET', unpack(KEYS))} end
local vals = {}
for i = 1, #KEYS, 4000 do
  local chunk = redis.call('MGET', unpack(KEYS, i, math.min(i + 3999, #KEYS)))
  for _, v in ipairs(chunk) do vals[#vals + 1] = v end
  if not chunk[#chunk] then break end
end
return {now, vals}
