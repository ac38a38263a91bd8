-- steal.lua: make the caller the holder of a lock on one node, whoever
-- holds it (Locker.Steal), advancing the node's fencing counter as a grant
-- does (see acquire.lua); the node's queue of waiters is left alone.
--
-- KEYS[1]  the lock key            <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  the waiters' queue      (unused: listed as acquire.lua's are)
-- KEYS[3]  default layout only: the node's fencing counter
-- ARGV[1]  the caller's token
-- ARGV[2]  the TTL in milliseconds
--
-- Returns the node's counter (> 0) in the default layout, {1, 0} in the
-- compat layout: acquire.lua's replies for a grant.
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
if not KEYS[3] then
	return {1, 0}
end
local f = redis.call("INCR", KEYS[3])
if f == 1 then
	local t = redis.call("TIME")
	f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[3], string.format("%d", f))
end
return f
