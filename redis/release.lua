-- release.lua: delete the lock only if it is still this lease's, and tell
-- waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
--
-- Publishes an empty message on KEYS[1] .. ":released" when it deletes; a
-- failed PUBLISH (an ACL user without rights on the channel) does not fail
-- the release, which has happened by then: waiters fall back to polling.
-- Returns 1 when the key held the token and was deleted, 0 otherwise (gone,
-- or another owner's).
if redis.call("GET", KEYS[1]) == ARGV[1] then
	redis.call("DEL", KEYS[1])
	redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
	return 1
end
return 0
