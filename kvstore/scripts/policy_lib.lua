-- Shared by the policy_*.lua scripts (fleet state, layout 2 inside key layout v1; kvstore/RATIONALE.md,
-- "Fleet state"). KEYS[1]: <base>{blobs}:index. ARGV[1]: the key prefix "<base>{blobs}:" (every key these
-- scripts touch starts with it, so they share KEYS[1]'s hash slot); ARGV[2]: the change channel.
-- A stack is a LIST "<base>{blobs}:stack:<model>" of entries "<version> <config JSON>", oldest (the floor)
-- first; "<base>{blobs}:models" is the SET of models with a stack; "<base>{blobs}:active" the layout-1 HASH
-- model -> {"version","config"} kept equal to each stack's top for older gateways.
local p, channel = ARGV[1], ARGV[2]
local function version_of(entry)
  local i = string.find(entry, ' ', 1, true)
  return string.sub(entry, 1, i - 1), string.sub(entry, i + 1)
end
local function legacy(entry)
  local v, c = version_of(entry)
  return '{"version":"' .. v .. '","config":' .. c .. '}'
end
local function set_top(model, k)
  redis.call('HSET', p .. 'active', model, legacy(redis.call('LINDEX', k, -1)))
end
-- keep_legacy writes the layout-1 value of a new stack's top only where an older gateway left none: an
-- existing value is that gateway's activation, adopted by the next reconcile (Activate with IfLegacy).
local function keep_legacy(model, k)
  redis.call('HSETNX', p .. 'active', model, legacy(redis.call('LINDEX', k, -1)))
end
local function stack_reply(k)
  local out = redis.call('LRANGE', k, 0, -1)
  table.insert(out, 1, 'ok')
  return out
end
