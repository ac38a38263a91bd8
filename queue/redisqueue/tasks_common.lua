-- tasks_common.lua: helpers every task-queue script starts with (the Go side
-- prepends this file to each). Every script takes the same keys, all in the
-- queue's hash slot (Q is the queue name, P the key prefix):
--
-- KEYS[1]  P{Q}:due      sorted set: waiting tasks, scored by due time (ms,
--                        the server's clock)
-- KEYS[2]  P{Q}:claimed  sorted set: claimed tasks, scored by the claim's
--                        deadline (ms)
-- KEYS[3]  P{Q}:dead     sorted set: dead-lettered tasks, scored by when
-- KEYS[4]  P{Q}:payload  hash: id -> payload
-- KEYS[5]  P{Q}:info     hash: id -> "<attempts>:<claim token>" (token
--                        empty unless claimed; no field: "0:", a task
--                        never claimed)
-- KEYS[6]  P{Q}:waiters  sorted set: the Clients that may have a Claim or
--                        Pop waiting on the queue (one member per Client
--                        and wait session), scored by when the entry lapses
--                        (ms); the key expires with its last entry
--
-- Wake-ups are PUBLISHed on KEYS[1] .. ":ready", only while some entry of
-- KEYS[6] has not lapsed: each message wakes one waiter of each Client
-- subscribed. A waiting Client's Claim or Pop that finds nothing due
-- renews its entry in the same script (register), so that a change after
-- it publishes; its waiters look again at least every 5s (package
-- queue's longest wait), well within an entry's waiterLife. Redis deletes
-- a sorted set or hash when its last member goes: a drained queue leaves
-- no key.

-- clock returns the server's now in ms twice: rounded down, to tell whether
-- a due time or deadline has passed, and rounded up, to count a new one
-- from (with a duration the client rounded up): so a deadline is never
-- earlier than the client's belief, counted from before it sent the request.
local function clock()
	local t = redis.call("TIME")
	local s, us = tonumber(t[1]) * 1000, tonumber(t[2])
	return s + math.floor(us / 1000), s + math.floor((us + 999) / 1000)
end

-- after is the due time ms after the clock's now (ms rounded up by the
-- client): start + ms, or now (rounded down) for no delay, due at once.
local function after(now, start, ms)
	if ms == 0 then
		return now
	end
	return start + ms
end

-- info returns a task's attempts and claim token.
local function info(id)
	local v = redis.call("HGET", KEYS[5], id)
	if not v then
		return 0, ""
	end
	local a, tok = string.match(v, "^(%d+):(.*)$")
	return tonumber(a), tok
end

-- recover makes expired claims (deadline <= now) due again at their
-- deadline, or dead-letters those that have had max deliveries (max 0:
-- never).
local function recover(now, max)
	local exp = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now, "WITHSCORES", "LIMIT", 0, 1000)
	for i = 1, #exp, 2 do
		local id = exp[i]
		local a = info(id)
		redis.call("ZREM", KEYS[2], id)
		redis.call("HSET", KEYS[5], id, a .. ":")
		if max > 0 and a >= max then
			redis.call("ZADD", KEYS[3], now, id)
		else
			redis.call("ZADD", KEYS[1], exp[i + 1], id)
		end
	end
end

-- wait is the time in ms until the next task is due or the next claim
-- expires, -1 when there is neither.
local function wait(now)
	local w = -1
	for _, k in ipairs({KEYS[1], KEYS[2]}) do
		local first = redis.call("ZRANGE", k, 0, 0, "WITHSCORES")
		if first[2] then
			local x = math.max(tonumber(first[2]) - now, 0)
			if w < 0 or x < w then
				w = x
			end
		end
	end
	return w
end

-- forget removes a task's payload and info.
local function forget(id)
	redis.call("HDEL", KEYS[4], id)
	redis.call("HDEL", KEYS[5], id)
end

-- waiterLife is how long, in ms, a waiter's entry in KEYS[6] lasts
-- unless renewed.
local waiterLife = 15000

-- register enters or renews the waiter entry member, dropping lapsed
-- ones.
local function register(now, member)
	redis.call("ZREMRANGEBYSCORE", KEYS[6], "-inf", now)
	redis.call("ZADD", KEYS[6], now + waiterLife, member)
	redis.call("PEXPIRE", KEYS[6], waiterLife)
end

-- wake tells the waiting Clients, if any, that a task may be due sooner
-- than their last look said. A failed PUBLISH (an ACL user without rights
-- on the channel) does not fail the change: waiters fall back to their
-- timers.
local function wake(now)
	if redis.call("ZCOUNT", KEYS[6], "(" .. now, "+inf") > 0 then
		redis.pcall("PUBLISH", KEYS[1] .. ":ready", "")
	end
end
