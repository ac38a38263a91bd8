-- tasks_enqueue.lua: add a task, or keep, replace or reschedule a queued one.
-- ARGV[1] id; ARGV[2] delay ms; ARGV[3] due time ms ("" for now + delay;
-- both rounded up by the caller, as now is here);
-- ARGV[4] payload; ARGV[5] mode: "0" keep, "1" replace, "2" reschedule.
-- Returns 1 added, 2 kept, 3 replaced, 4 rescheduled.
local now, start = clock()
local id = ARGV[1]
local due = after(now, start, tonumber(ARGV[2]))
if ARGV[3] ~= "" then
	due = tonumber(ARGV[3])
end
local result = 1
if ARGV[5] == "0" then
	-- Keep: one write when the id is new, none when it is queued.
	if redis.call("ZSCORE", KEYS[2], id) or redis.call("ZADD", KEYS[1], "NX", due, id) == 0 then
		return 2
	end
elseif redis.call("ZSCORE", KEYS[1], id) or redis.call("ZSCORE", KEYS[2], id) then
	local a = info(id)
	redis.call("ZREM", KEYS[2], id) -- ends a claim
	redis.call("ZADD", KEYS[1], due, id)
	redis.call("HSET", KEYS[5], id, a .. ":")
	result = 4
	if ARGV[5] == "1" then
		redis.call("HSET", KEYS[4], id, ARGV[4])
		result = 3
	end
else
	redis.call("ZADD", KEYS[1], due, id)
end
if result == 1 then
	if redis.call("ZREM", KEYS[3], id) == 1 then
		redis.call("HDEL", KEYS[5], id) -- a dead task is added anew, attempts 0
	end
	redis.call("HSET", KEYS[4], id, ARGV[4])
end
wake(now)
return result
