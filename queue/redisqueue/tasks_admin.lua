-- tasks_admin.lua: Delete, Stats, Dead and Requeue.
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
local now, start = clock()
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
		table.insert(out, id)
		table.insert(out, dead[i + 1])
		table.insert(out, (info(id)))
		table.insert(out, redis.call("HGET", KEYS[4], id) or "")
		table.insert(out, "")
	end
	return out
elseif op == "requeue" then
	if not redis.call("ZSCORE", KEYS[3], ARGV[2]) then
		return 0
	end
	redis.call("ZREM", KEYS[3], ARGV[2])
	redis.call("ZADD", KEYS[1], after(now, start, tonumber(ARGV[3])), ARGV[2])
	redis.call("HSET", KEYS[5], ARGV[2], "0:")
	wake(now)
	return 1
elseif op == "unwait" then
	redis.call("ZREM", KEYS[6], ARGV[2])
	return 1
end
return redis.error_reply("tasks_admin.lua: unknown operation " .. op)
