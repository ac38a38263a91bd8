-- acquire.sql: take the advisory lock of one name, waiting for it or not, and
-- set the session up as the lease's: its idle_session_timeout becomes the TTL,
-- so the server ends the session (and the lock with it) when the holder stops
-- running statements on it for that long.
--
-- Parameters:
--   $1 text  the key text: the Locker's key prefix followed by the lock name.
--            The lock's 64-bit key is hashtextextended($1, 0).
--   $2 int4  the backend pid the connection announced at startup: the lock is
--            taken only if pg_backend_pid() is that pid (0: no check; see
--            Options.SessionPooler).
--   $3 text  the lease's idle_session_timeout, in milliseconds: the TTL.
--
-- Placeholders (in double braces), replaced once per Locker:
--   lock   pg_advisory_lock(hashtextextended($1, 0)) IS NOT NULL, which
--          waits in the server's FIFO lock queue until granted or cancelled
--          (Acquire), or pg_try_advisory_lock(hashtextextended($1, 0)), one
--          attempt (TryAcquire);
--   fence  nextval of the fencing sequence (see fence.go), or 0 without
--          fencing.
--
-- Returns one row:
--   pid        int4    pg_backend_pid()
--   key        int8    the lock's key
--   prev_idle  text    idle_session_timeout before this statement, for release
--   fence      int8    granted: the fencing token (0 without fencing); -1:
--                      held by someone else; NULL: the pid did not match
--                      (nothing tried)
--   waited     float8  seconds from the statement's start to the end of the
--                      grant, on the server's clock
--
-- One Result node, no subquery: the statement costs little more than the
-- lock function itself. The target list is evaluated in order, so prev_idle
-- is read before the lock is taken and waited after. CASE evaluates a branch
-- only when its condition holds, so the session's idle_session_timeout is
-- set, and the fencing token taken, only once the lock is granted: tokens
-- follow grant order (the sequence only grows). A statement that fails (a
-- cancelled wait) rolls its set_config call back with its implicit
-- transaction.
SELECT pg_backend_pid() AS pid,
       hashtextextended($1, 0) AS key,
       current_setting('idle_session_timeout') AS prev_idle,
       CASE WHEN $2 <> 0 AND pg_backend_pid() <> $2 THEN NULL
            WHEN {{lock}} THEN
              CASE WHEN set_config('idle_session_timeout', $3, false) IS NOT NULL THEN {{fence}} END
            ELSE -1
       END AS fence,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited
