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
-- A payload field exists exactly while the id is queued or dead: a new id
-- costs this one write besides its ZADD.
if redis.call("HSETNX", KEYS[4], id, ARGV[4]) == 1 then
	redis.call("ZADD", KEYS[1], due, id)
	wake(now)
	return 1
end
local result = 1
if redis.call("ZREM", KEYS[3], id) == 1 then
	-- A dead task is added anew, attempts 0.
	redis.call("HSET", KEYS[4], id, ARGV[4])
	redis.call("HDEL", KEYS[4], id .. "\0")
elseif ARGV[5] == "0" then
	return 2
else
	if not redis.call("ZSCORE", KEYS[1], id) then
		local m = findClaim(id) -- ends a claim
		if m then
			local _, a = claimOf(m)
			unclaimed(m, id, a)
		end
	end
	result = 4
	if ARGV[5] == "1" then
		redis.call("HSET", KEYS[4], id, ARGV[4])
		result = 3
	end
end
redis.call("ZADD", KEYS[1], due, id)
wake(now)
return result
