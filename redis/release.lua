-- release.lua: delete the lock only if it is still this lease's, and tell
-- waiters; in the default layout, also leave the queue and hand the lock to
-- the first live waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  default layout only: the fencing counter   <prefix>{<name>}:fence
-- KEYS[3]  default layout only: the queue             <prefix>{<name>}:queue
-- KEYS[4]  default layout only: the waiter entries    <prefix>{<name>}:waiters
-- KEYS[5]  default layout only: the holder's metadata <prefix>{<name>}:meta
-- ARGV[1]  the lease token
-- ARGV[2]  default layout only, and only when the lease has metadata: "m"
--
-- Compat layout: publishes an empty message on KEYS[1] .. ":released" when
-- it deletes.
--
-- Default layout: removes the token's own queue entry, if any, so the same
-- script is also how a cancelled waiter leaves the queue (and gives back a
-- lock handed to it meanwhile). When it deletes the lock it pops the
-- first live waiter (deadline not passed; dead entries on the way are
-- dropped), sets the lock to that waiter's token with its TTL, advances the
-- counter as acquire.lua does (INCR; a missing counter starts at the
-- server's TIME in µs) and publishes "g:<token>:<fence>" on the waiter's
-- grant channel (its entry is "deadline_ms ttl_ms channel"; see acquire.lua). When the queue holds only dead
-- entries it deletes the lock and publishes an empty message, as in the
-- compat layout, so that a waiter whose entry lapsed (a pause longer than its
-- lifetime) looks again at once. With the queue empty it publishes nothing:
-- every default-layout waiter is queued (acquire.lua enqueues it in the same
-- call that finds the lock busy), so no one listens, and a PUBLISH costs as
-- much as the rest of the script.
--
-- Metadata (see acquire.lua): with ARGV[2] it deletes KEYS[5] when it
-- deletes the lock, and the token's "m:" field with its entry; a handoff to
-- a waiter whose entry is marked sets KEYS[5] for it. Without ARGV[2] and
-- with no marked entry at the head it touches neither. A holder with
-- metadata (a leader) also publishes an empty message on the release
-- channel once it released, whether it handed the lock on or not, so that
-- those who watch the name (Locker.Observe) look again at once; waiters
-- woken by it look again too, which costs a round trip each, for metadata
-- holders only.
--
-- A failed PUBLISH (an ACL user without rights on the channel) does not fail
-- the release, which has happened by then: waiters fall back to polling.
-- Returns 1 when the key held the token and was deleted (or handed on), 0
-- otherwise (gone, or another owner's).

-- nextFence advances the counter and returns the new fencing token, as in
-- acquire.lua.
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

local held = redis.call("GET", KEYS[1]) == ARGV[1]
if not KEYS[2] then
	if held then
		redis.call("DEL", KEYS[1])
		redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
		return 1
	end
	return 0
end

if not held then
	redis.call("ZREM", KEYS[3], ARGV[1])
	if ARGV[2] then
		redis.call("HDEL", KEYS[4], ARGV[1], "m:" .. ARGV[1])
	else
		redis.call("HDEL", KEYS[4], ARGV[1])
	end
	return 0
end
if ARGV[2] then
	redis.call("DEL", KEYS[5])
end
-- A holder has no entry: every grant removes the grantee's (acquire.lua
-- when it grants the caller, the handoffs when they pop the head). Nobody
-- queued, the common case, is asked with EXISTS (an empty sorted set does
-- not exist): on Redis 7.0 a ZRANGE of a missing key from a script takes
-- about 4µs of server time more than an EXISTS.
if redis.call("EXISTS", KEYS[3]) == 0 then
	redis.call("DEL", KEYS[1])
	if ARGV[2] then
		redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
	end
	return 1
end
local head = redis.call("ZRANGE", KEYS[3], 0, 0)
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _ = 1, 100 do
	if #head == 0 then
		break
	end
	local w = head[1]
	local e = redis.call("HGET", KEYS[4], w)
	redis.call("ZREM", KEYS[3], w)
	local deadline, ttl, m, ch
	if e then
		deadline, ttl, m, ch = string.match(e, "^(%d+) (%d+)(m?) ?(.*)$")
	end
	local meta
	if m == "m" then
		meta = redis.call("HGET", KEYS[4], "m:" .. w)
		redis.call("HDEL", KEYS[4], w, "m:" .. w)
	else
		redis.call("HDEL", KEYS[4], w)
	end
	if e then
		if deadline and tonumber(deadline) >= now then
			redis.call("SET", KEYS[1], w, "PX", ttl)
			if meta then
				redis.call("SET", KEYS[5], string.format("%s\n%d\n%s", w, now, meta), "PX", ttl)
			end
			local f = nextFence()
			if ch == "" then
				ch = KEYS[1] .. ":released"
			end
			redis.pcall("PUBLISH", ch, string.format("g:%s:%d", w, f))
			if ARGV[2] then
				redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
			end
			return 1
		end
	end
	head = redis.call("ZRANGE", KEYS[3], 0, 0)
end
redis.call("DEL", KEYS[1])
redis.pcall("PUBLISH", KEYS[1] .. ":released", "")
return 1
