-- try_fence.sql: one attempt at a user-level lock and, granted, its
-- fencing token: three statements sent together in one round trip, on the
-- driver's own pools (which allow several statements per request).
-- $KEY: the lock's name on the server (LockName), as a literal. The fence
-- table's name (Options.FenceTable, quoted) replaces $TABLE.
-- The UPDATE is fence.sql's on the row whose id is GET_LOCK's result: row
-- 1 when the lock was granted; when it was not, no row (0, or NULL), so a
-- busy attempt changes nothing, takes no token and, looking the row up by
-- its key, need not lock it. It runs on the session that now holds the lock, as fence.sql
-- does, so the token orders as fence.sql says, and it is durable when the
-- request's answer comes.
-- Returns one row: GET_LOCK's result (1 granted, 0 busy, NULL killed), the
-- session's connection id, the rows the UPDATE changed (1 when it took a
-- token) and the token.
SET @dlock_got = GET_LOCK($KEY, 0);
UPDATE $TABLE SET n = LAST_INSERT_ID(n + 1) WHERE id = @dlock_got;
SELECT @dlock_got, CONNECTION_ID(), ROW_COUNT(), LAST_INSERT_ID()
