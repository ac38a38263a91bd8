-- acquire.lua: take the lock on one node if it is free and, in the default
-- layout, count a fencing token on that node, atomically.
--
-- KEYS[1]  the lock key            <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  default layout only: the node's fencing counter <prefix>{<name>}:fence
-- ARGV[1]  the attempt's token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
--
-- Returns an array:
--   {1, counter}        acquired; counter is the node's fencing counter after
--                       its INCR (0 in the compat layout)
--   {0, pttl, holder}   held by someone else: pttl is the holder's remaining
--                       time in ms (-1: no expiry), holder the value the key
--                       holds ("" when it is not a string)
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	if KEYS[2] then
		return {1, redis.call("INCR", KEYS[2])}
	end
	return {1, 0}
end
local holder = redis.pcall("GET", KEYS[1])
if type(holder) ~= "string" then
	holder = ""
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl < -1 then
	pttl = 0
end
return {0, pttl, holder}
