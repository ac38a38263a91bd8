-- members_refresh.lua: extend a permit or a reader's hold, held in a sorted
-- set of tokens scored by expiry, only if it is still live; or, with a TTL
-- of 0, only say whether it is. Never re-creates a hold that is gone.
--
-- KEYS[1]   the holders: <prefix>{<name>}:permits or <prefix>{<name>}:rw:readers
--           ZSET token -> expiry (server ms)
-- KEYS[2..] keys that live as long as the set (the semaphore's limit key):
--           their expiry is extended with it, and they are deleted when the
--           set is gone
-- ARGV[1]   the lease token
-- ARGV[2]   the new TTL in milliseconds; 0: only check
--
-- Returns 1 when the token holds a live entry (extended to now + TTL when
-- asked), 0 otherwise; an expired entry of the token is removed.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local s = redis.call("ZSCORE", KEYS[1], ARGV[1])
if not s then
	return 0
end
if tonumber(s) <= now then
	redis.call("ZREM", KEYS[1], ARGV[1])
	if redis.call("EXISTS", KEYS[1]) == 0 then
		for k = 2, #KEYS do
			redis.call("DEL", KEYS[k])
		end
	end
	return 0
end
if ttl == 0 then
	return 1
end
redis.call("ZADD", KEYS[1], "XX", now + ttl, ARGV[1])
for k = 1, #KEYS do
	if redis.call("PTTL", KEYS[k]) < ttl then
		redis.call("PEXPIRE", KEYS[k], ttl)
	end
end
return 1
