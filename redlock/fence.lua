-- fence.lua: raise one node's fencing counter to a lease's fencing token, if
-- that node still holds the lease's lock. The counter never goes down.
--
-- KEYS[1]  the lock key            <prefix>{<name>}
-- KEYS[2]  the node's fencing counter <prefix>{<name>}:fence
-- ARGV[1]  the lease token
-- ARGV[2]  the fencing token (decimal)
--
-- Returns 1 when the node holds the token (and its counter is now at least
-- the fencing token), 0 otherwise (nothing changed).
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
	return 0
end
local cur = tonumber(redis.call("GET", KEYS[2]) or "0")
if cur == nil or cur < tonumber(ARGV[2]) then
	redis.call("SET", KEYS[2], ARGV[2])
end
return 1
