-- Sets a fenced key unless a higher fence is stored with it.
-- KEYS[1]: the key, a hash with the fields "value" and "fence".
-- ARGV[1]: the writer's fence, decimal without leading zeros (compared as a
--          string, length first, so that no fence loses precision as a
--          Lua number); ARGV[2]: the value.
-- Returns {1, ARGV[1]} when set, {0, the stored fence} when refused.
local cur = redis.call('HGET', KEYS[1], 'fence')
if cur and (#cur > #ARGV[1] or (#cur == #ARGV[1] and cur > ARGV[1])) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1, ARGV[1]}
