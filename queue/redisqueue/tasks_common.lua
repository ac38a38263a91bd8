-- tasks_common.lua: helpers every task-queue script starts with (the Go side
-- prepends this file to each). Every script takes the same keys, all in the
-- queue's hash slot (Q is the queue name, P the key prefix):
--
-- KEYS[1]  P{Q}:due      sorted set: waiting tasks, scored by due time (ms,
--                        the server's clock)
-- KEYS[2]  P{Q}:claimed  sorted set: claims, scored by the claim's deadline
--                        (ms); the member is id .. "\0" .. token, the token
--                        "<attempts>:<random>:<index>" (the task's attempts
--                        with this delivery)
-- KEYS[3]  P{Q}:dead     sorted set: dead-lettered tasks, scored by when
-- KEYS[4]  P{Q}:payload  hash, two fields per task: id -> payload (present
--                        exactly while the task is queued or dead), and
--                        id .. "\0" -> attempts before its current claim
--                        (absent: 0)
-- KEYS[5]  P{Q}:info     hash of the previous layout (id -> "<attempts>:
--                        <token>"): emptied by tasks_admin.lua's "migrate",
--                        read for claims an older client made
-- KEYS[6]  P{Q}:waiters  sorted set: the Clients that may have a Claim or
--                        Pop waiting on the queue (one member per Client
--                        and wait session), scored by when the entry lapses
--                        (ms); the key expires with its last entry
--
-- Ids never contain a NUL byte (they are validated as lock names), so a
-- field or member with one cannot be an id.
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

-- member is a claim's member of KEYS[2].
local function member(id, tok)
	return id .. "\0" .. tok
end

-- claimOf splits a member of KEYS[2] into the task's id and the
-- attempts its claim counts. A member without a NUL is the previous
-- layout's (an older client's claim): its attempts are in KEYS[5].
local function claimOf(m)
	local p = string.find(m, "%z")
	if not p then
		local v = redis.call("HGET", KEYS[5], m)
		return m, tonumber(v and string.match(v, "^(%d+):") or 0)
	end
	return string.sub(m, 1, p - 1), tonumber(string.match(string.sub(m, p + 1), "^(%d+):") or 0)
end

-- unclaimed records a task's attempts once its claim has ended
-- otherwise than by an ack.
local function unclaimed(m, id, a)
	redis.call("ZREM", KEYS[2], m)
	if m == id then
		redis.call("HDEL", KEYS[5], id)
	end
	redis.call("HSET", KEYS[4], id .. "\0", a)
end

-- recover makes expired claims (deadline <= now) due again at their
-- deadline, or dead-letters those that have had max deliveries (max 0:
-- never).
local function recover(now, max)
	local exp = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now, "WITHSCORES", "LIMIT", 0, 1000)
	for i = 1, #exp, 2 do
		local m = exp[i]
		local id, a = claimOf(m)
		unclaimed(m, id, a)
		if max > 0 and a >= max then
			redis.call("ZADD", KEYS[3], now, id)
		else
			redis.call("ZADD", KEYS[1], exp[i + 1], id)
		end
	end
end

-- findClaim returns the member of KEYS[2] of a claim on id, or nil: a
-- scan of the claims (Replace and Reschedule of a claimed task only).
local function findClaim(id)
	if redis.call("ZSCORE", KEYS[2], id) then
		return id -- the previous layout's
	end
	local pat = string.gsub(id, "[%*%?%[%]\\]", "\\%0") .. "\0*"
	local cursor = "0"
	repeat
		local r = redis.call("ZSCAN", KEYS[2], cursor, "MATCH", pat, "COUNT", 1000)
		cursor = r[1]
		if r[2][1] then
			return r[2][1]
		end
	until cursor == "0"
	return nil
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

-- forget removes a task's payload and attempts.
local function forget(id)
	redis.call("HDEL", KEYS[4], id, id .. "\0")
end

-- waiterLife is how long, in ms, a waiter's entry in KEYS[6] lasts
-- unless renewed.
local waiterLife = 15000

-- register enters or renews the waiter entry, dropping lapsed ones.
local function register(now, entry)
	redis.call("ZREMRANGEBYSCORE", KEYS[6], "-inf", now)
	redis.call("ZADD", KEYS[6], now + waiterLife, entry)
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
