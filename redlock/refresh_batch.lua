-- refresh_batch.lua: refresh.lua for many leases in one call on one node
-- (the watchdog's batches): each lock is extended only if it still holds
-- its lease's token; a lock that is gone is never re-created.
--
-- KEYS     per lease, its lock key
-- ARGV     per lease two values: its token and its new TTL in milliseconds
--
-- Returns per lease 1 when its TTL was set, 0 when it did not hold.
local out = {}
for i = 1, #KEYS do
	local r = 0
	if redis.pcall("GET", KEYS[i]) == ARGV[2 * i - 1] then
		r = redis.call("PEXPIRE", KEYS[i], ARGV[2 * i])
	end
	out[i] = r
end
return out
