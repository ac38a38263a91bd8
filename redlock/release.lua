-- release.lua: delete the lock on one node only if it still holds the
-- lease's token and, for a release, hand it to the node's next waiter. A
-- wait that has ended without a grant, or a hand-off that reached its
-- Locker after the wait ended, gives back what was handed to it the same
-- way: ARGV[1] is then the wait's hand-off token and ARGV[3] its ticket.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiters' queue      KEYS[1] .. ":waiters": a sorted set of
--          tickets "<locker>:<wait>:<ttl>" scored by when each began to wait
-- KEYS[3]  default layout only: the node's fencing counter
-- ARGV[1]  the lease token, or a wait's hand-off token ("" for a waiter
--          that only watched: nothing to give back)
-- ARGV[2]  "1": hand the lock on (a release); "0": do not (the clean-up of
--          an attempt that did not win a majority, so that contenders are
--          not handed each other's retreats)
-- ARGV[3]  optional: the ticket of a wait that has ended, removed from the
--          queue first
--
-- Handing on: the first ticket of the queue whose Locker still
-- listens (PUBLISH counts a subscriber on KEYS[1] .. ":released:<locker>")
-- is granted the lock in this script: the counter is advanced as a grant
-- does (see acquire.lua), the lock set to the wait's hand-off token <wait>
-- for <ttl> ms, the ticket removed, and "<wait>:<counter>" published on that
-- Locker's channel. A ticket without a TTL ("<locker>:<waiter>", or a TTL
-- of 0: a waiter that only watches) is only told "<waiter>" and keeps its
-- place. Tickets of Lockers that no longer listen are dropped on the way (at
-- most 8 a release). A failed PUBLISH (an ACL user without rights on the
-- channels) does not fail the release, which has happened by then, and
-- hands nothing: waiters fall back to polling. Nothing is published when
-- the queue is empty: every waiter of this version queues, so no one
-- listens (versions before 2026-11-25 also published an empty message on
-- KEYS[1] .. ":released" for their unqueued waiters, a PUBLISH per node and
-- release, about a tenth of an uncontended cycle on 5 nodes).
-- Returns 1 when the key held the token and was deleted, 0 otherwise.
if ARGV[3] then
	redis.call("ZREM", KEYS[2], ARGV[3])
end
if ARGV[1] == "" or redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call("DEL", KEYS[1])
if ARGV[2] ~= "1" then
	return 1
end
-- Nobody queued, the common case, is asked with EXISTS (an empty sorted set
-- does not exist): on Redis 7.0 a ZRANGE of a missing key from a script
-- costs about 4µs of server time more (see redis/release.lua).
if redis.call("EXISTS", KEYS[2]) == 0 then
	return 1
end
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
				break
			end
			if n > 0 then
				redis.call("SET", KEYS[1], wait, "PX", ttl)
				redis.call("ZREM", KEYS[2], head)
				break
			end
		else
			local n = redis.pcall("PUBLISH", channel, wait)
			if type(n) ~= "number" or n > 0 then
				break
			end
		end
	end
	redis.call("ZREM", KEYS[2], head)
end
return 1
