-- rw_acquire.lua: take the read or the write side of a read/write lock,
-- atomically; a writer that finds it busy while waiting registers its wait,
-- which keeps new readers out.
--
-- KEYS[1]  the readers        <prefix>{<name>}:rw:readers  ZSET token -> expiry (server ms)
-- KEYS[2]  the writer         <prefix>{<name>}:rw:writer   string: the writer's token, PX TTL
-- KEYS[3]  the writers' waits <prefix>{<name>}:rw:waits    ZSET wait id -> deadline (server ms)
-- KEYS[4]  the write counter  <prefix>{<name>}:rw:fence    integer
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  "r" (read side) or "w" (write side)
-- ARGV[4]  the wait id of a waiting writer; "" for none (a TryLock, a reader)
--
-- Returns an array:
--   {1, fence}   granted; fence is the writer's new token, 0 for a reader
--                (a token holding the side asked for already is renewed)
--   {0, ms}      busy: what blocks it ends in ms at the latest (-1: a key
--                without expiry, unknown)
--
-- A reader is busy while a writer holds, or while a writer's wait is
-- registered and not past its deadline. A writer is busy while another
-- writer or any live reader holds; if it waits, its wait is registered (or
-- renewed) with the deadline now + ms + TTL, past which a writer that died
-- waiting no longer keeps readers out; its grant removes the wait. The
-- waits' set carries an expiry at least as late as its deadlines, the
-- readers' set one at least as late as its scores.
--
-- The counter advances as acquire.lua's does, on write grants only.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, ttl = ARGV[1], tonumber(ARGV[2])

local function extend(k, ms)
	if redis.call("PTTL", k) < ms then
		redis.call("PEXPIRE", k, ms)
	end
end

redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local writer = redis.call("GET", KEYS[2])

if ARGV[3] == "r" then
	if writer then
		return {0, math.max(redis.call("PTTL", KEYS[2]), -1)}
	end
	if redis.call("EXISTS", KEYS[3]) == 1 then
		redis.call("ZREMRANGEBYSCORE", KEYS[3], "-inf", now)
		local last = redis.call("ZRANGE", KEYS[3], -1, -1, "WITHSCORES")
		if #last > 0 then
			return {0, math.max(tonumber(last[2]) - now, 0)}
		end
	end
	redis.call("ZADD", KEYS[1], now + ttl, token)
	extend(KEYS[1], ttl)
	return {1, 0}
end

local busy
if writer and writer ~= token then
	busy = math.max(redis.call("PTTL", KEYS[2]), -1)
elseif redis.call("ZCARD", KEYS[1]) > 0 then
	local first = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
	busy = math.max(tonumber(first[2]) - now, 0)
end
if busy then
	if ARGV[4] ~= "" then
		local life = math.max(busy, 0) + ttl
		redis.call("ZADD", KEYS[3], now + life, ARGV[4])
		extend(KEYS[3], life)
	end
	return {0, busy}
end
redis.call("SET", KEYS[2], token, "PX", ttl)
if ARGV[4] ~= "" then
	redis.call("ZREM", KEYS[3], ARGV[4])
end
local f = redis.call("INCR", KEYS[4])
if f == 1 then
	f = tonumber(t[1]) * 1000000 + tonumber(t[2])
	redis.call("SET", KEYS[4], string.format("%d", f))
end
return {1, f}
