-- tasks_take.lua: Peek, Pop or Claim up to n due tasks, in due order.
-- ARGV[1] "peek", "pop" or "claim"; ARGV[2] n; ARGV[3] claim: visibility
-- ms; ARGV[4] claim: max attempts (0: no dead-lettering); ARGV[5] claim: a
-- random token part (each claim's token is "<attempts>:" .. it .. ":" ..
-- its index); ARGV[6] pop and claim: the Client's waiter entry, "" when it
-- has no waiter on the queue (see register).
-- Returns {wait ms, then per task: id, due ms, attempts, payload, token}:
-- wait is the time until the next task is due or claim expires (-1: none)
-- when it takes no task, 0 when it takes some (the caller asks again at
-- once, if at all). A batch costs one command per key it touches, however
-- many tasks it takes.
local now, start = clock()
local op, n = ARGV[1], tonumber(ARGV[2])
local max = 0
if op == "claim" then
	max = tonumber(ARGV[4])
end
recover(now, max)
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now, "WITHSCORES", "LIMIT", 0, n)
local out = {0}
if #due == 0 then
	out[1] = wait(now)
	if op ~= "peek" and ARGV[6] ~= "" then
		register(now, ARGV[6])
	end
	return out
end
local ids, fields = {}, {}
for i = 1, #due, 2 do
	table.insert(ids, due[i])
	table.insert(fields, due[i])
	table.insert(fields, due[i] .. "\0")
end
local v = redis.call("HMGET", KEYS[4], unpack(fields))
local claims = {}
for j, id in ipairs(ids) do
	local a, tok = tonumber(v[2 * j] or 0), ""
	if op == "claim" then
		a = a + 1
		tok = a .. ":" .. ARGV[5] .. ":" .. j
		table.insert(claims, start + tonumber(ARGV[3]))
		table.insert(claims, member(id, tok))
	end
	table.insert(out, id)
	table.insert(out, due[2 * j])
	table.insert(out, a)
	table.insert(out, v[2 * j - 1] or "")
	table.insert(out, tok)
end
if op == "claim" then
	redis.call("ZREM", KEYS[1], unpack(ids))
	redis.call("ZADD", KEYS[2], unpack(claims))
elseif op == "pop" then
	redis.call("ZREM", KEYS[1], unpack(ids))
	redis.call("HDEL", KEYS[4], unpack(fields))
end
return out
