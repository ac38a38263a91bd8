-- refresh.lua: extend the lock only if it is still this lease's; never
-- re-creates a lock that is gone.
--
-- KEYS[1]  the lock key
-- KEYS[2]  only for a lease with metadata: its key <prefix>{<name>}:meta,
--          extended with the lock
-- ARGV[1]  the lease token
-- ARGV[2]  the new TTL in milliseconds
--
-- Returns 1 when the key held the token and its TTL was set, -1 when
-- another token holds it (taken over), 0 when it is gone.
local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then
	if KEYS[2] then
		redis.call("PEXPIRE", KEYS[2], ARGV[2])
	end
	return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
if v then
	return -1
end
return 0
