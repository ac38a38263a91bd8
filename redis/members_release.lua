-- members_release.lua: give back a permit or a reader's hold, held in a
-- sorted set of tokens scored by expiry, only if it is this token's, and
-- tell waiters.
--
-- KEYS[1]   the holders: <prefix>{<name>}:permits or <prefix>{<name>}:rw:readers
--           ZSET token -> expiry (server ms)
-- KEYS[2..] keys that live as long as the set (the semaphore's limit key):
--           deleted with its last holder
-- ARGV[1]   the lease token
-- ARGV[2]   the channel to tell waiters on: <prefix>{<name>}:permits:released
--           or <prefix>{<name>}:rw:released
--
-- Expired holders are dropped on the way. When the token had an entry it
-- is removed and an empty message PUBLISHed on the channel (a failed
-- PUBLISH, for an ACL user without rights on it, does not fail the
-- release: waiters then poll).
--
-- Returns 1 when the token held a live entry, 0 otherwise (gone, expired,
-- or never there).
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call("ZSCORE", KEYS[1], ARGV[1])
if not s then
	return 0
end
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
if redis.call("EXISTS", KEYS[1]) == 0 then
	for k = 2, #KEYS do
		redis.call("DEL", KEYS[k])
	end
end
redis.pcall("PUBLISH", ARGV[2], "")
if tonumber(s) > now then
	return 1
end
return 0
