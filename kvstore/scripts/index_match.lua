-- kvgate index match (layout v1). KEYS: the prompt's block keys in order (one hash slot).
-- A field is an endpoint; its value is expiresMs*4 + tier bits (1 GPU, 2 CPU); expiresMs > now means a
-- live speculative hold, which counts as GPU. Returns a flat array: endpoint, gpuBlocks, cpuBlocks, ...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gpu, cpu, alive, order = {}, {}, {}, {}
local nalive = 0
for i = 1, #KEYS do
  local h = redis.call('HGETALL', KEYS[i])
  local seen = {}
  for j = 1, #h, 2 do
    local ep = h[j]
    if i == 1 or alive[ep] then
      local v = tonumber(h[j + 1])
      local tiers = v % 4
      local exp = (v - tiers) / 4
      if tiers % 2 == 1 or exp > now then
        seen[ep] = true
        if i == 1 then order[#order + 1] = ep; gpu[ep] = 1; cpu[ep] = 0 else gpu[ep] = gpu[ep] + 1 end
      elseif tiers >= 2 then
        seen[ep] = true
        if i == 1 then order[#order + 1] = ep; gpu[ep] = 0; cpu[ep] = 1 else cpu[ep] = cpu[ep] + 1 end
      end
    end
  end
  alive = seen
  nalive = 0
  for _ in pairs(seen) do nalive = nalive + 1 end
  if nalive == 0 then break end
end
local out = {}
for _, ep in ipairs(order) do
  out[#out + 1] = ep; out[#out + 1] = gpu[ep]; out[#out + 1] = cpu[ep]
end
return out
