-- Per-endpoint cap (layout 2). KEYS[1]: one of the endpoint's family HASHes; ARGV[1]: how many fields to
-- sample. Deletes the confirmed fields among a random sample (random eviction, like layout 1's SPOP).
-- Returns how many it deleted.
local r = redis.call('HRANDFIELD', KEYS[1], tonumber(ARGV[1]))
local del = {}
for _, f in ipairs(r) do if #f == 8 then del[#del + 1] = f end end
if #del > 0 then redis.call('HDEL', KEYS[1], unpack(del)) end
return #del
