-- steal.lua: make the caller the holder of a lock at once, whoever holds
-- it (Locker.Steal), with the next fencing token; waiters keep their
-- places in the queue, behind the new holder.
--
-- Compat layout (one key):
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
--
-- Returns 1.
--
-- Default layout: the five keys of acquire.lua, of which it touches the
-- lock, the fencing counter and the holder's metadata.
--
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the caller's metadata, only when it has some
--
-- Returns the new fencing token. The previous holder's metadata goes with
-- its lock: the caller's replaces it, or it is deleted. The previous holder
-- finds out at its next refresh (refresh.lua answers -1: another token);
-- nothing is published, since nobody else's view changes: the lock was held
-- and still is.
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
if not KEYS[2] then
	return 1
end

-- nextFence as in acquire.lua.
local f = redis.call("INCR", KEYS[2])
if f == 1 then
	local t = redis.call("TIME")
	f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[2], string.format("%d", f))
end
if ARGV[3] then
	local t = redis.call("TIME")
	local since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call("SET", KEYS[5], string.format("%s\n%d\n%s", ARGV[1], since, ARGV[3]), "PX", ARGV[2])
else
	redis.call("DEL", KEYS[5])
end
return f
