-- permit_acquire.lua: take one of a semaphore's permits, atomically: drop
-- the holders whose permits expired, refuse a limit other than the
-- holders', grant while fewer than the limit hold, and count a fencing
-- token.
--
-- KEYS[1]  the holders     <prefix>{<name>}:permits        ZSET token -> expiry (server ms)
-- KEYS[2]  the limit       <prefix>{<name>}:permits:limit  string: the holders' limit
-- KEYS[3]  the counter     <prefix>{<name>}:permits:fence  integer
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the limit asked for
--
-- Returns an array:
--   {1, fence}    granted (or the token held a live permit already: renewed,
--                 with a new fence); fence is the new token
--   {0, ms}       busy: the first holder's permit expires in ms
--   {3, limit}    refused: the holders use limit, not ARGV[3]
--
-- A holder is live while its score is above the server's time. The set and
-- the limit key carry an expiry at least as late as every score, so that a
-- semaphore whose holders all died vanishes by itself; the limit key goes
-- with the last holder (permit_release.lua, members_refresh.lua).
--
-- The counter advances as acquire.lua's does (INCR; a missing counter
-- starts at the server's TIME in µs), so permit tokens strictly increase
-- with the grants of the semaphore, across a restart without persistence
-- under the same clock assumption.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local n = redis.call("ZCARD", KEYS[1])
local held = n > 0 and redis.call("GET", KEYS[2])
if held then
	held = tonumber(held)
	if held ~= limit then
		return {3, held}
	end
	if n >= limit and not redis.call("ZSCORE", KEYS[1], token) then
		local first = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
		return {0, math.max(tonumber(first[2]) - now, 0)}
	end
else
	-- The first holder (or the limit key was lost): its limit is the
	-- semaphore's.
	redis.call("SET", KEYS[2], ARGV[3])
end

redis.call("ZADD", KEYS[1], now + ttl, token)
for k = 1, 2 do
	if redis.call("PTTL", KEYS[k]) < ttl then
		redis.call("PEXPIRE", KEYS[k], ttl)
	end
end
local f = redis.call("INCR", KEYS[3])
if f == 1 then
	f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[3], string.format("%d", f))
end
return {1, f}
