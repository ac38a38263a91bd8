-- release.lua: delete the lock on one node only if it still holds the
-- lease's token and, for a release, hand it to the node's next waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiters' queue      KEYS[1] .. ":waiters": a sorted set of
--          tickets "<locker>:<waiter>" scored by when each began to wait
-- KEYS[3]  the reservation         KEYS[1] .. ":next"
-- ARGV[1]  the lease token
-- ARGV[2]  "1": announce the release (a release); "0": announce nothing (the
--          clean-up of an attempt that did not win a majority, so that
--          contenders are not woken by each other's retreats)
-- ARGV[3]  how long the lock stays reserved for the next waiter, in ms
--
-- Announcing: an empty message on KEYS[1] .. ":released" (heard by waiters
-- that do not queue: older versions), then the first ticket of the queue
-- whose Locker still listens (PUBLISH counts a subscriber on
-- KEYS[1] .. ":released:<locker>") gets its waiter's id there, and the lock
-- is reserved for that ticket for ARGV[3] ms (see acquire.lua). Tickets of
-- Lockers that no longer listen are dropped on the way (at most 8 a
-- release). A failed PUBLISH (an ACL user without rights on the channels)
-- does not fail the release, which has happened by then, and drops nothing:
-- waiters fall back to polling.
-- Returns 1 when the key held the token and was deleted, 0 otherwise.
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call("DEL", KEYS[1])
if ARGV[2] ~= "1" then
	return 1
end
redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
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
			redis.call("SET", KEYS[3], head, "PX", ARGV[3])
			break
		end
	end
	redis.call("ZREM", KEYS[2], head)
end
return 1
