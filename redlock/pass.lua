-- pass.lua: pass on a hand-off that reached a Locker whose waiter has left
-- (see release.lua): drop its ticket and, if the lock is still free and
-- reserved for that ticket, hand it to the next waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiters' queue
-- KEYS[3]  the reservation
-- ARGV[1]  the ticket of the waiter that has left
-- ARGV[2]  how long the lock stays reserved for the next waiter, in ms
--
-- Returns 1 when the hand-off was passed on, 0 otherwise.
redis.call("ZREM", KEYS[2], ARGV[1])
if redis.call("GET", KEYS[3]) ~= ARGV[1] then
	return 0
end
redis.call("DEL", KEYS[3])
if redis.call("EXISTS", KEYS[1]) == 1 then
	return 0
end
for _ = 1, 8 do
	local head = redis.call("ZRANGE", KEYS[2], 0, 0)[1]
	if not head then
		break
	end
	local locker, waiter = string.match(head, "^(%x+):(%x+)$")
	if locker then
		local n = redis.pcall("PUBLISH", KEYS[1] .. ":released:" .. locker, waiter)
		if type(n) ~= "number" then
			break
		end
		if n > 0 then
			redis.call("SET", KEYS[3], head, "PX", ARGV[2])
			return 1
		end
	end
	redis.call("ZREM", KEYS[2], head)
end
return 0
