-- refresh_batch.lua: refresh.lua for many leases in one call (the
-- watchdog's batches): each lock is extended only if it still holds its
-- lease's token; a lock that is gone is never re-created.
--
-- KEYS     per lease, its lock key, then its metadata key when it has one
-- ARGV     per lease three values: its token, its new TTL in milliseconds,
--          and how many keys it has (1 or 2)
--
-- Returns per lease 1 when its TTL was set, -1 when another token holds
-- its lock (taken over), 0 when the lock is gone.
local out = {}
local k = 1
for i = 1, #ARGV, 3 do
	local n = tonumber(ARGV[i + 2])
	local r = 0
	local v = redis.call("GET", KEYS[k])
	if v == ARGV[i] then
		if n == 2 then
			redis.call("PEXPIRE", KEYS[k + 1], ARGV[i + 1])
		end
		r = redis.call("PEXPIRE", KEYS[k], ARGV[i + 1])
	elseif v then
		r = -1
	end
	out[#out + 1] = r
	k = k + n
end
return out
