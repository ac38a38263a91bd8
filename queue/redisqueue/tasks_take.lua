-- tasks_take.lua: Peek, Pop or Claim up to n due tasks, in due order.
-- ARGV[1] "peek", "pop" or "claim"; ARGV[2] n; ARGV[3] claim: visibility
-- ms; ARGV[4] claim: max attempts (0: no dead-lettering); ARGV[5] claim: a
-- random token prefix (each claim's token is it .. ":" .. its index);
-- ARGV[6] pop and claim: the Client's waiter entry, "" when it has no
-- waiter on the queue (see register).
-- Returns {wait ms, then per task: id, due ms, attempts, payload, token}:
-- wait is the time until the next task is due or claim expires (-1: none)
-- when it takes no task, 0 when it takes some (the caller asks again at
-- once, if at all).
local now, start = clock()
local op, n = ARGV[1], tonumber(ARGV[2])
local max = 0
if op == "claim" then
	max = tonumber(ARGV[4])
end
recover(now, max)
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now, "WITHSCORES", "LIMIT", 0, n)
local out = {0}
for i = 1, #due, 2 do
	local id = due[i]
	local a, tok = info(id), ""
	local payload = redis.call("HGET", KEYS[4], id) or ""
	if op == "claim" then
		a = a + 1
		tok = ARGV[5] .. ":" .. ((i + 1) / 2)
		redis.call("ZREM", KEYS[1], id)
		redis.call("ZADD", KEYS[2], start + tonumber(ARGV[3]), id)
		redis.call("HSET", KEYS[5], id, a .. ":" .. tok)
	elseif op == "pop" then
		redis.call("ZREM", KEYS[1], id)
		forget(id)
	end
	table.insert(out, id)
	table.insert(out, due[i + 1])
	table.insert(out, a)
	table.insert(out, payload)
	table.insert(out, tok)
end
if #due == 0 then
	out[1] = wait(now)
	if op ~= "peek" and ARGV[6] ~= "" then
		register(now, ARGV[6])
	end
end
return out
