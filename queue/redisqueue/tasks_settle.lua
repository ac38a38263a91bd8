-- tasks_settle.lua: Ack, Extend or Nack a claim, if it is current (the task
-- claimed with this token and the claim's deadline not passed).
-- ARGV[1] "ack", "extend" or "nack"; ARGV[2] id; ARGV[3] token; ARGV[4]
-- extend: ms from now; nack: delay ms; ARGV[5] nack: max attempts (0: no
-- dead-lettering).
-- Returns 1 when done, 0 when the claim is not current.
local now, start = clock()
local id = ARGV[2]
local m = member(id, ARGV[3])
local deadline = redis.call("ZSCORE", KEYS[2], m)
if not deadline or tonumber(deadline) <= now then
	return 0
end
if ARGV[1] == "ack" then
	redis.call("ZREM", KEYS[2], m)
	forget(id)
elseif ARGV[1] == "extend" then
	redis.call("ZADD", KEYS[2], start + tonumber(ARGV[4]), m)
else
	local _, a = claimOf(m)
	unclaimed(m, id, a)
	local max = tonumber(ARGV[5])
	if max > 0 and a >= max then
		redis.call("ZADD", KEYS[3], now, id)
	else
		redis.call("ZADD", KEYS[1], after(now, start, tonumber(ARGV[4])), id)
		wake(now)
	end
end
return 1
