-- refresh.lua: extend the lock on one node only if it still holds the
-- lease's token; never re-creates a lock that is gone.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
-- ARGV[2]  the new TTL in milliseconds
--
-- Returns 1 when the key held the token and its TTL was set, 0 otherwise.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
	return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
