-- rw_release.lua: give back the write side of a read/write lock only if it
-- is this token's, and/or end a writer's wait; tell waiters.
--
-- KEYS[1]  the writer         <prefix>{<name>}:rw:writer
-- KEYS[2]  the writers' waits <prefix>{<name>}:rw:waits
-- ARGV[1]  the lease token; "" for none (only end the wait)
-- ARGV[2]  a writer's wait id to remove; "" for none
-- ARGV[3]  the channel to tell waiters on: <prefix>{<name>}:rw:released
--
-- It deletes the writer key if it holds the token and removes the wait; if
-- either happened it PUBLISHes an empty message on the channel (readers
-- kept out by the wait, writers and readers behind the writer look again;
-- a failed PUBLISH does not fail the release).
--
-- Returns 1 when the writer key held the token and was deleted, 0
-- otherwise.
local released = 0
if ARGV[1] ~= "" and redis.call("GET", KEYS[1]) == ARGV[1] then
	redis.call("DEL", KEYS[1])
	released = 1
end
local ended = 0
if ARGV[2] ~= "" then
	ended = redis.call("ZREM", KEYS[2], ARGV[2])
end
if released == 1 or ended == 1 then
	redis.pcall("PUBLISH", ARGV[3], "")
end
return released
