-- acquire.lua: take the lock on one node if it is free and, in the default
-- layout, advance the node's fencing counter, atomically.
--
-- KEYS[1]  the lock key            <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  default layout only: the node's fencing counter <prefix>{<name>}:fence
-- ARGV[1]  the attempt's token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
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
--                       holds ("" when it is not a string)
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	if not KEYS[2] then
		return {1, 0}
	end
	if redis.call("EXISTS", KEYS[2]) == 1 then
		return {1, redis.call("INCR", KEYS[2])}
	end
	local t = redis.call("TIME")
	local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[2], string.format("%d", f))
	return {1, f}
end
local holder = redis.pcall("GET", KEYS[1])
if type(holder) ~= "string" then
	holder = ""
elseif holder == ARGV[1] then
	-- This attempt's own lock: the client sent the script again after a
	-- connection error had lost the reply to its first run.
	if not KEYS[2] then
		return {1, 0}
	end
	return {1, tonumber(redis.call("GET", KEYS[2]) or "0")}
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl < -1 then
	pttl = 0
end
return {0, pttl, holder}
