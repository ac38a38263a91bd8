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
-- Returns 1. The previous holder finds out at its next refresh.
--
-- Default layout: the five keys of acquire.lua, of which it touches the
-- lock, the fencing counter and the holder's metadata.
--
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the prefix's steal channel ("<prefix>taken")
-- ARGV[4]  the caller's metadata, only when it has some
--
-- Returns the new fencing token. The previous holder's metadata goes with
-- its lock: the caller's replaces it, or it is deleted. The previous
-- holder's token is published on the steal channel, "t:<token>": every
-- Locker of the prefix that holds a lease listens there, and the one whose
-- lease it is reports the loss at once (its next refresh, which answers -1,
-- another token, finds it too). Waiters are told nothing, since their view
-- does not change: the lock was held and still is.
if not KEYS[2] then
	redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
	return 1
end
local old = redis.call("GET", KEYS[1])
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])

-- nextFence as in acquire.lua.
local f = redis.call("INCR", KEYS[2])
if f == 1 then
	local t = redis.call("TIME")
	f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[2], string.format("%d", f))
end
if ARGV[4] then
	local t = redis.call("TIME")
	local since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call("SET", KEYS[5], string.format("%s\n%d\n%s", ARGV[1], since, ARGV[4]), "PX", ARGV[2])
else
	redis.call("DEL", KEYS[5])
end
-- A failed PUBLISH (an ACL user without rights on the channel) does not
-- fail the steal: the old holder's refresh finds it.
if old and old ~= ARGV[1] then
	redis.pcall("PUBLISH", ARGV[3], "t:" .. old)
end
return f
