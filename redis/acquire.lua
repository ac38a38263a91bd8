-- acquire.lua: take a free lock and, in the default layout, count a fencing
-- token, atomically.
--
-- KEYS[1]  the lock key          <prefix>{<name>}, or <prefix><name> (compat)
-- KEYS[2]  the fencing counter   <prefix>{<name>}:fence (same hash slot);
--          absent in the compat layout, which has no fencing
-- ARGV[1]  the lease token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
--
-- Returns an integer:
--   n >= 1   acquired: n is the new fencing token (INCR of KEYS[2]), or 1
--            without KEYS[2]
--   0        held by someone else, with no expiry (PTTL -1: a foreign key)
--   n <= -1  held by someone else, whose lock expires in (-n - 1) ms
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	if KEYS[2] then
		return redis.call("INCR", KEYS[2])
	end
	return 1
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl == -1 then
	return 0
end
-- The script runs atomically, so the key cannot have vanished since the
-- SET; clamp anyway.
return -1 - math.max(pttl, 0)
