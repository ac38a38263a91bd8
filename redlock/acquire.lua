-- acquire.lua: take the lock on one node if it is free and not reserved for
-- another waiter and, in the default layout, advance the node's fencing
-- counter, atomically.
--
-- KEYS[1]  the lock key            <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  the waiters' queue      KEYS[1] .. ":waiters" (see release.lua)
-- KEYS[3]  the reservation         KEYS[1] .. ":next"
-- KEYS[4]  default layout only: the node's fencing counter <prefix>{<name>}:fence
-- ARGV[1]  the attempt's token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the tickets of the caller's Locker waiting on the name, each
--          between spaces (" " for none)
-- ARGV[4]  the caller's own ticket when it is known ("" otherwise): removed
--          from the queue when the lock is taken
-- ARGV[5]  how long the queue lives after a registration, in ms
-- ARGV[6], ARGV[7], ...  pairs of a score and a ticket: the caller's
--          Locker's waiters on the name, registered in the queue (ZADD NX:
--          a ticket keeps its place) when the lock is busy or reserved
--
-- A release hands the lock to the next waiter by reserving it for that
-- waiter's ticket for a few ms (KEYS[3], with an expiry); while the
-- reservation lasts, only an attempt of the Locker that holds that ticket
-- may take the lock, so that the waiter woken for it is not overtaken by
-- one that did not wait. A reservation only refuses: a grant still needs the
-- SET NX, and a reservation expires by itself.
--
-- The counter is INCRed; a missing counter (the name's first use on the
-- node, or a restart without persistence that lost it) starts at the
-- server's TIME in µs. Grants of one name come at most one per round trip,
-- so a counter never outruns the µs elapsed since it started: a node that
-- lost its counter starts again above every token handed out before it was
-- lost, as long as the nodes' clocks agree to within the time since then.
-- Counters of nodes that saw the same grants stay equal.
--
-- Returns an array:
--   {1, counter}        acquired (or found already taken by this very token:
--                       a run repeated by the client after a lost reply);
--                       counter is the node's fencing counter now (0 in the
--                       compat layout)
--   {0, pttl, holder}   held by someone else: pttl is the holder's remaining
--                       time in ms (-1: no expiry), holder the value the key
--                       holds ("" when it is not a string); or free but
--                       reserved: pttl is the reservation's, holder the
--                       ticket it is reserved for
local reserved = redis.call("GET", KEYS[3])
if reserved and string.find(ARGV[3], " " .. reserved .. " ", 1, true) then
	reserved = false
end
if not reserved and redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	redis.call("DEL", KEYS[3])
	if ARGV[4] ~= "" then
		redis.call("ZREM", KEYS[2], ARGV[4])
	end
	if not KEYS[4] then
		return {1, 0}
	end
	if redis.call("EXISTS", KEYS[4]) == 1 then
		return {1, redis.call("INCR", KEYS[4])}
	end
	local t = redis.call("TIME")
	local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[4], string.format("%d", f))
	return {1, f}
end
local holder = redis.pcall("GET", KEYS[1])
if type(holder) ~= "string" then
	holder = ""
elseif holder == ARGV[1] then
	-- This attempt's own lock: the client sent the script again after a
	-- connection error had lost the reply to its first run.
	if not KEYS[4] then
		return {1, 0}
	end
	return {1, tonumber(redis.call("GET", KEYS[4]) or "0")}
end
if #ARGV >= 6 then
	for j = 6, #ARGV, 2 do
		redis.call("ZADD", KEYS[2], "NX", ARGV[j], ARGV[j + 1])
	end
	redis.call("PEXPIRE", KEYS[2], ARGV[5])
end
if holder == "" and reserved then
	return {0, math.max(redis.call("PTTL", KEYS[3]), 0), reserved}
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl < -1 then
	pttl = 0
end
return {0, pttl, holder}
