-- acquire.lua: take the lock on one node if it is free (or handed to the
-- caller's wait, see below) and, in the default layout, advance the node's
-- fencing counter, atomically.
--
-- KEYS[1]  the lock key            <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  the waiters' queue      KEYS[1] .. ":waiters" (see release.lua)
-- KEYS[3]  default layout only: the node's fencing counter <prefix>{<name>}:fence
-- ARGV[1]  the attempt's token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the caller's own ticket when it is known ("" otherwise): removed
--          from the queue when the lock is taken
-- ARGV[4]  how long the queue lives after a registration, in ms
-- ARGV[5]  the hand-off token of the caller's wait ("" for none): the value
--          a release stores when it hands the lock to that wait
-- ARGV[6]  "1": adopt a lock handed to the wait (take it for this attempt:
--          its value becomes ARGV[1], with the full TTL); "0": report it
-- ARGV[7], ARGV[8], ...  pairs of a score and a ticket: the caller's
--          Locker's waiters on the name, registered in the queue (ZADD NX:
--          a ticket keeps its place) when the lock is busy
-- ARGV[3] to ARGV[6] are left out by an attempt with no ticket, no wait and
-- no waiters to register (an uncontended TryAcquire): as "", "", "", "0".
--
-- The counter is INCRed with every grant (a SET NX here, an adoption, or a
-- hand-off in release.lua); a missing counter (the name's first use on the
-- node, or a restart without persistence that lost it: INCR makes it 1)
-- starts at the server's TIME in µs. Grants of one name come at most one per round trip,
-- so a counter never outruns the µs elapsed since it started: a node that
-- lost its counter starts again above every token handed out before it was
-- lost, as long as the nodes' clocks agree to within the time since then.
-- Counters of nodes that saw the same grants stay equal.
--
-- Returns counter alone (an integer, always > 0) when this call took the
-- free lock in the default layout (the common case: an integer reply costs
-- the server ~2µs less than an array), else an array:
--   {1, counter[, "adopted"]}
--                       acquired, or adopted from the wait (marked), or found already
--                       taken by this very token (a run repeated by the
--                       client after a lost reply); counter is the node's
--                       fencing counter now (0 in the compat layout)
--   {2, counter}        handed to the caller's wait and not adopted (ARGV[6]
--                       "0"): the lock holds ARGV[5]
--   {0, pttl, holder}   held by someone else: pttl is the holder's remaining
--                       time in ms (-1: no expiry), holder the value the key
--                       holds ("" when it is not a string)
local function granted(tag)
	if ARGV[3] and ARGV[3] ~= "" then
		redis.call("ZREM", KEYS[2], ARGV[3])
	end
	if not KEYS[3] then
		return {1, 0, tag}
	end
	local f = redis.call("INCR", KEYS[3])
	if f == 1 then
		-- The counter was missing: start it at the server's clock.
		local t = redis.call("TIME")
		f = tonumber(t[1]) * 1000000 + tonumber(t[2])
		redis.call("SET", KEYS[3], string.format("%d", f))
	end
	if not tag then
		return f
	end
	return {1, f, tag}
end
local function counter()
	if not KEYS[3] then
		return 0
	end
	return tonumber(redis.call("GET", KEYS[3]) or "0")
end
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	return granted()
end
local holder = redis.pcall("GET", KEYS[1])
if type(holder) ~= "string" then
	holder = ""
elseif holder == ARGV[1] then
	-- This attempt's own lock: the client sent the script again after a
	-- connection error had lost the reply to its first run.
	return {1, counter()}
elseif ARGV[5] and ARGV[5] ~= "" and holder == ARGV[5] then
	if ARGV[6] == "1" then
		redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
		return granted("adopted")
	end
	return {2, counter()}
end
if #ARGV >= 7 then
	for j = 7, #ARGV, 2 do
		redis.call("ZADD", KEYS[2], "NX", ARGV[j], ARGV[j + 1])
	end
	redis.call("PEXPIRE", KEYS[2], ARGV[4])
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl < -1 then
	pttl = 0
end
return {0, pttl, holder}
