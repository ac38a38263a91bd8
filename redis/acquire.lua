-- acquire.lua: take a free lock and, in the default layout, count a fencing
-- token, atomically; in the default layout, also keep the FIFO queue of
-- waiters: grant in arrival order, hand a lock left free by an expired holder
-- to the first live waiter, and enqueue or renew the caller when asked to.
--
-- Compat layout (one key):
--
-- KEYS[1]  the lock key          <prefix><name>
-- ARGV[1]  the lease token, stored as the lock key's value
-- ARGV[2]  the TTL in milliseconds
--
-- Returns an integer:
--   1        acquired
--   0        held by someone else, with no expiry (PTTL -1: a foreign key)
--   n <= -1  held by someone else, whose lock expires in (-n - 1) ms
--
-- Default layout (five keys, one hash slot):
--
-- KEYS[1]  the lock key          <prefix>{<name>}
-- KEYS[2]  the fencing counter   <prefix>{<name>}:fence
-- KEYS[3]  the queue             <prefix>{<name>}:queue   ZSET token -> arrival (server µs)
-- KEYS[4]  the waiter entries    <prefix>{<name>}:waiters HASH token -> "deadline_ms ttl_ms[m] channel"
--                                (and "m:"<token> -> metadata for a waiter with metadata)
-- KEYS[5]  the holder's metadata <prefix>{<name>}:meta    "<token>\n<since_ms>\n<metadata>", PX as the lock
-- ARGV[1]  the lease token
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  wait_ms: 0 never enqueues (TryAcquire); > 0 enqueues the caller
--          when the lock is held (keeping its place if it is queued
--          already) and makes its entry live until now + wait_ms
-- ARGV[4]  with wait_ms > 0: the caller's grant channel, on which a lock
--          handed to it is announced (its Locker's own channel, so that a
--          grant reaches that one connection, not every waiter's);
--          "" with wait_ms 0 when ARGV[5] follows
-- ARGV[5]  the caller's metadata, only when it has some
--
-- Returns:
--   fence                   acquired by this call: an integer, the new
--                           fencing token (always > 0); not an array, which
--                           costs the server about 2µs more to return
--   {2, fence}              the lock already holds the caller's token: it was
--                           handed to the caller by an earlier release (or
--                           expiry takeover); fence is that grant's token
--   {0, pttl, counter}      busy: pttl is the holder's remaining time in ms
--                           (-1: no expiry), counter the fencing counter now
--
-- The counter is the current holder's fence: every grant SETs the lock and
-- advances the counter in one script, and nothing else changes either.
--
-- A grant advances the counter with INCR; a missing counter (the name's
-- first use, a restart without persistence, an eviction or a DEL) starts at
-- the server's TIME in µs instead. A grant takes at least one script run,
-- and a script run takes more than a µs of server time, so a counter never
-- outruns the µs elapsed since it started: one that was lost starts again
-- above every token handed out before, as long as the server's clock has
-- not gone back by more than the time since then. A counter that exists
-- keeps counting from where it is (one started at 1 by an earlier version
-- too). release.lua advances it the same way.
--
-- A waiter's entry is "deadline_ms ttl_ms channel". When this script hands
-- the lock to a waiter it publishes "g:<token>:<fence>" on the waiter's
-- channel (the release channel KEYS[1] .. ":released" for an entry without
-- one).
--
-- Metadata costs nothing to a request without it: only a grant to a holder
-- with metadata writes KEYS[5] (SET PX with the lock's TTL, since_ms the
-- server's time of the grant), and only a waiter with metadata marks its
-- entry ("deadline_ms ttl_msm channel") and stores its metadata in the
-- field "m:"<token> beside it, read when the lock is handed to it and
-- deleted with the entry. A grant to a holder without metadata leaves
-- KEYS[5] alone: it can only be a former holder's that has expired with its
-- lock (refresh.lua extends both together, release.lua deletes it), and
-- Inspect reports metadata only when its token is the lock's.
if not KEYS[2] then
	if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
		return 1
	end
	local pttl = redis.call("PTTL", KEYS[1])
	if pttl == -1 then
		return 0
	end
	return -1 - math.max(pttl, 0)
end

-- nextFence advances the counter and returns the new fencing token. It
-- stands again in release.lua (a hand-off is a grant) and in redlock's
-- acquire.lua and release.lua: a script run by EVAL cannot call another
-- script's functions (Redis Functions could, but need Redis 7 and a
-- FUNCTION LOAD on every server), so each script that grants carries it.
local function nextFence()
	local f = redis.call("INCR", KEYS[2])
	if f == 1 then
		-- The counter was missing: start it at the server's clock.
		local t = redis.call("TIME")
		f = tonumber(t[1]) * 1000000 + tonumber(t[2])
		redis.call("SET", KEYS[2], string.format("%d", f))
	end
	return f
end

-- setMeta stores the metadata m of the new holder tok, granted for ttl ms.
local function setMeta(tok, ttl, m)
	local t = redis.call("TIME")
	local since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call("SET", KEYS[5], string.format("%s\n%d\n%s", tok, since, m), "PX", ttl)
end

-- dropEntry removes the waiter entry of tok (with its metadata field when
-- marked).
local function dropEntry(tok, marked)
	if marked then
		redis.call("HDEL", KEYS[4], tok, "m:" .. tok)
	else
		redis.call("HDEL", KEYS[4], tok)
	end
end

local token = ARGV[1]
if redis.call("EXISTS", KEYS[3]) == 0 then
	-- Nobody waits: the common, uncontended case.
	if redis.call("SET", KEYS[1], token, "NX", "PX", ARGV[2]) then
		if ARGV[5] then
			setMeta(token, ARGV[2], ARGV[5])
		end
		return nextFence()
	end
end
local head = redis.call("ZRANGE", KEYS[3], 0, 0)

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call("GET", KEYS[1])
if cur == token then
	redis.call("ZREM", KEYS[3], token)
	dropEntry(token, ARGV[5])
	return {2, tonumber(redis.call("GET", KEYS[2]) or "0")}
end

if not cur then
	-- Free, with waiters queued: drop dead entries at the head (bounded),
	-- then grant to the caller if it is first, else hand to the first.
	local first, firstTTL, firstChannel, firstMarked
	for _ = 1, 100 do
		if #head == 0 then
			break
		end
		local e = redis.call("HGET", KEYS[4], head[1])
		local marked = false
		if e then
			local deadline, ttl, m, ch = string.match(e, "^(%d+) (%d+)(m?) ?(.*)$")
			marked = m == "m"
			if deadline and tonumber(deadline) >= now then
				first, firstTTL, firstChannel, firstMarked = head[1], ttl, ch, marked
				break
			end
		end
		redis.call("ZREM", KEYS[3], head[1])
		dropEntry(head[1], marked)
		head = redis.call("ZRANGE", KEYS[3], 0, 0)
	end
	if not first and #head > 0 then
		-- Too many dead entries for one call: the caller comes back at once.
		return {0, 0, tonumber(redis.call("GET", KEYS[2]) or "0")}
	end
	if not first or first == token then
		redis.call("SET", KEYS[1], token, "PX", ARGV[2])
		if ARGV[5] then
			setMeta(token, ARGV[2], ARGV[5])
		end
		redis.call("ZREM", KEYS[3], token)
		dropEntry(token, ARGV[5])
		return nextFence()
	end
	redis.call("SET", KEYS[1], first, "PX", firstTTL)
	if firstMarked then
		local m = redis.call("HGET", KEYS[4], "m:" .. first)
		if m then
			setMeta(first, firstTTL, m)
		end
	end
	local f = nextFence()
	redis.call("ZREM", KEYS[3], first)
	dropEntry(first, firstMarked)
	if firstChannel == "" then
		firstChannel = KEYS[1] .. ":released"
	end
	redis.pcall("PUBLISH", firstChannel, string.format("g:%s:%d", first, f))
end

local wait = tonumber(ARGV[3])
if wait > 0 then
	redis.call("ZADD", KEYS[3], "NX", string.format("%d", tonumber(t[1]) * 1000000 + tonumber(t[2])), token)
	if ARGV[5] then
		redis.call("HSET", KEYS[4], token, string.format("%d %sm %s", now + wait, ARGV[2], ARGV[4]), "m:" .. token, ARGV[5])
	else
		redis.call("HSET", KEYS[4], token, string.format("%d %s %s", now + wait, ARGV[2], ARGV[4] or ""))
	end
	-- The keys outlive every entry's deadline, so that entries of dead
	-- waiters vanish with them even if no one comes to clean up.
	for k = 3, 4 do
		if redis.call("PTTL", KEYS[k]) < wait then
			redis.call("PEXPIRE", KEYS[k], wait)
		end
	end
end
local pttl = redis.call("PTTL", KEYS[1])
if pttl < -1 then
	pttl = 0
end
return {0, pttl, tonumber(redis.call("GET", KEYS[2]) or "0")}
