-- tasks_admin.lua: Delete, Stats, Dead, Requeue, and the waiter entries'
-- and the previous layout's upkeep.
-- ARGV[1] the operation:
--   "delete"  ARGV[2] id, ARGV[3] due ms: remove the waiting task if it is
--             due at that time; returns 1 or 0
--   "stats"   returns {due, delayed, claimed, dead} (an expired claim
--             counts as due)
--   "dead"    ARGV[2] n: returns, oldest death first, per task: id, death
--             ms, attempts, payload, ""
--   "requeue" ARGV[2] id, ARGV[3] delay ms: move a dead task back with its
--             attempts reset; returns 1 or 0
--   "unwait"  ARGV[2] a waiter entry: remove it (its Client's waiters of the
--             queue are gone); returns 1
--   "migrate" ARGV[2] an HSCAN cursor of KEYS[5] ("0" to start): move the
--             previous layout's attempts of tasks not under an older
--             client's claim into KEYS[4]; returns the next cursor ("0":
--             done)
local op = ARGV[1]
if op == "delete" then
	local sc = redis.call("ZSCORE", KEYS[1], ARGV[2])
	if sc and tonumber(sc) == tonumber(ARGV[3]) then
		redis.call("ZREM", KEYS[1], ARGV[2])
		forget(ARGV[2])
		return 1
	end
	return 0
elseif op == "stats" then
	local now = clock()
	local expired = redis.call("ZCOUNT", KEYS[2], "-inf", now)
	return {
		redis.call("ZCOUNT", KEYS[1], "-inf", now) + expired,
		redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf"),
		redis.call("ZCARD", KEYS[2]) - expired,
		redis.call("ZCARD", KEYS[3]),
	}
elseif op == "dead" then
	local dead = redis.call("ZRANGE", KEYS[3], 0, tonumber(ARGV[2]) - 1, "WITHSCORES")
	local out = {}
	for i = 1, #dead, 2 do
		local id = dead[i]
		local v = redis.call("HMGET", KEYS[4], id, id .. "\0")
		table.insert(out, id)
		table.insert(out, dead[i + 1])
		table.insert(out, tonumber(v[2] or 0))
		table.insert(out, v[1] or "")
		table.insert(out, "")
	end
	return out
elseif op == "requeue" then
	local now, start = clock()
	if redis.call("ZREM", KEYS[3], ARGV[2]) == 0 then
		return 0
	end
	redis.call("ZADD", KEYS[1], after(now, start, tonumber(ARGV[3])), ARGV[2])
	redis.call("HDEL", KEYS[4], ARGV[2] .. "\0")
	wake(now)
	return 1
elseif op == "unwait" then
	redis.call("ZREM", KEYS[6], ARGV[2])
	return 1
elseif op == "migrate" then
	if redis.call("EXISTS", KEYS[5]) == 0 then
		return "0"
	end
	local r = redis.call("HSCAN", KEYS[5], ARGV[2], "COUNT", 1000)
	local kv = r[2]
	for i = 1, #kv, 2 do
		local id = kv[i]
		-- An older client's claim keeps its entry: its Ack reads it, and
		-- so does recover.
		if not redis.call("ZSCORE", KEYS[2], id) then
			local a = tonumber(string.match(kv[i + 1], "^(%d+):") or 0)
			if a > 0 and redis.call("HEXISTS", KEYS[4], id) == 1 then
				redis.call("HSET", KEYS[4], id .. "\0", a)
			end
			redis.call("HDEL", KEYS[5], id)
		end
	end
	return r[1]
end
return redis.error_reply("tasks_admin.lua: unknown operation " .. op)
