-- Match. KEYS: the prompt's block keys in order (one hash slot); ARGV[1] (optional): "all" reads on past a
-- missing block 0. Returns {now ms, {block values...}}; the prefix runs are computed by the caller. Stops at
-- the first chunk that ends in a missing block: block 0 alone first (a prompt nobody has seen costs one
-- lookup), then chunks of 4000.
local vals = redis.call('MGET', KEYS[1])
if not vals[1] and ARGV[1] ~= 'all' then return {now, vals} end
for i = 2, #KEYS, 4000 do
  local chunk = redis.call('MGET', unpack(KEYS, i, math.min(i + 3999, #KEYS)))
  for _, v in ipairs(chunk) do vals[#vals + 1] = v end
  if not chunk[#chunk] and ARGV[1] ~= 'all' then break end
end
return {now, vals}
