-- acquire_all.lua: take several free locks at once, all or none, counting
-- a fencing token for each (the default layout; Locker.TryAcquireAll and
-- the first attempt of AcquireAll).
--
-- KEYS     per name, its five keys in acquire.lua's order: the lock, the
--          fencing counter, the queue, the waiter entries, the metadata
-- ARGV     per name its lease token, then last the TTL in milliseconds
--
-- A name is free when its lock key is missing and nobody is queued for it
-- (a queued waiter is served first, by acquire.lua). Returns the fencing
-- tokens in order when every name was free and is now taken, else
-- {0, i, pttl} for the first name i that is not free, pttl its holder's
-- remaining ms (-1: no expiry; -2: free but waited for), and takes none.
local n = #ARGV - 1
local ttl = ARGV[#ARGV]
for i = 1, n do
	local k = (i - 1) * 5
	if redis.call("EXISTS", KEYS[k + 1]) == 1 then
		return {0, i, redis.call("PTTL", KEYS[k + 1])}
	end
	if redis.call("EXISTS", KEYS[k + 3]) == 1 then
		return {0, i, -2}
	end
end
local out = {}
for i = 1, n do
	local k = (i - 1) * 5
	redis.call("SET", KEYS[k + 1], ARGV[i], "PX", ttl)
	-- nextFence as in acquire.lua.
	local f = redis.call("INCR", KEYS[k + 2])
	if f == 1 then
		local t = redis.call("TIME")
		f = tonumber(t[1]) * 1000000 + tonumber(t[2])
		redis.call("SET", KEYS[k + 2], string.format("%d", f))
	end
	out[i] = f
end
return out
