-- pass.lua: give back what was handed to a wait that has ended without a
-- grant, or that reached its Locker after it ended (see release.lua): drop
-- its ticket and, if the lock holds the wait's hand-off token, delete it and
-- hand it to the next waiter as a release does.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiters' queue
-- KEYS[3]  default layout only: the node's fencing counter
-- ARGV[1]  the ticket of the wait that has ended
-- ARGV[2]  its hand-off token ("" for a waiter that only watched: nothing
--          to give back)
--
-- Returns 1 when the lock was handed on, 0 otherwise.
redis.call("ZREM", KEYS[2], ARGV[1])
if ARGV[2] == "" or redis.pcall("GET", KEYS[1]) ~= ARGV[2] then
	return 0
end
redis.call("DEL", KEYS[1])
-- handOn: keep in step with release.lua.
for _ = 1, 8 do
	local head = redis.call("ZRANGE", KEYS[2], 0, 0)[1]
	if not head then
		break
	end
	local locker, wait, ttl = string.match(head, "^(%x+):(%x+):(%d+)$")
	if not locker then
		locker, wait = string.match(head, "^(%x+):(%x+)$")
	end
	if locker then
		local channel = KEYS[1] .. ":released:" .. locker
		if ttl and tonumber(ttl) > 0 then
			local f = 0
			if KEYS[3] then
				if redis.call("EXISTS", KEYS[3]) == 1 then
					f = redis.call("INCR", KEYS[3])
				else
					local t = redis.call("TIME")
					f = tonumber(t[1]) * 1000000 + tonumber(t[2])
					redis.call("SET", KEYS[3], string.format("%d", f))
				end
			end
			local n = redis.pcall("PUBLISH", channel, wait .. ":" .. string.format("%d", f))
			if type(n) ~= "number" then
				return 0
			end
			if n > 0 then
				redis.call("SET", KEYS[1], wait, "PX", ttl)
				redis.call("ZREM", KEYS[2], head)
				return 1
			end
		else
			local n = redis.pcall("PUBLISH", channel, wait)
			if type(n) ~= "number" then
				return 0
			end
			if n > 0 then
				return 1
			end
		end
	end
	redis.call("ZREM", KEYS[2], head)
end
return 0
