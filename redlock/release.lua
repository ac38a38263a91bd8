-- release.lua: delete the lock on one node only if it still holds the
-- lease's token and, for a release, tell that node's waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
-- ARGV[2]  "1": publish an empty message on KEYS[1] .. ":released" when the
--          key is deleted (a release); "0": publish nothing (the clean-up of
--          an attempt that did not win a majority, so that contenders are
--          not all woken at once by each other's retreats)
--
-- A failed PUBLISH (an ACL user without rights on the channel) does not fail
-- the release, which has happened by then: waiters fall back to polling.
-- Returns 1 when the key held the token and was deleted, 0 otherwise.
if redis.pcall("GET", KEYS[1]) == ARGV[1] then
	redis.call("DEL", KEYS[1])
	if ARGV[2] == "1" then
		redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
	end
	return 1
end
return 0
