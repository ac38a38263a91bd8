-- acquire.sql: take the advisory lock of one name, waiting for it or not, and
-- set the session up as the lease's: its idle_session_timeout becomes the TTL,
-- so the server ends the session (and the lock with it) when the holder stops
-- running statements on it for that long.
--
-- Parameters:
--   $1 text  the key text: the Locker's key prefix followed by the lock name.
--            The lock's 64-bit key is hashtextextended($1, 0).
--   $2 bool  wait: true blocks in pg_advisory_lock (the server's FIFO lock
--            queue) until granted or cancelled; false makes one
--            pg_try_advisory_lock attempt.
--   $3 int4  the backend pid the connection announced at startup: the lock is
--            taken only if pg_backend_pid() is that pid (0: no check; see
--            Options.SessionPooler).
--   $4 text  the lease's idle_session_timeout, in milliseconds: the TTL.
--
-- The fence placeholder (in double braces) is replaced, once per Locker, by
-- nextval of the fencing sequence (see fence.go), or by NULL without fencing.
--
-- Returns one row:
--   pid        int4    pg_backend_pid()
--   key        int8    the lock's key
--   locked     bool    granted; NULL when the pid did not match (not tried)
--   waited     float8  seconds from the statement's start to the grant, on
--                      the server's clock
--   fence      int8    the fencing token, NULL unless locked (and fencing)
--   prev_idle  text    idle_session_timeout before this statement, for release
--
-- The inner query (kept apart by OFFSET 0) reads the settings and takes the
-- lock; the outer one runs after the grant, so the fencing token is taken
-- while the lock is held and tokens follow grant order (the sequence only
-- grows). Nothing is changed unless the lock was granted. A statement that
-- fails (cancelled wait) rolls its set_config call back with its implicit
-- transaction.
SELECT g.pid,
       g.key,
       g.locked,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited,
       CASE WHEN g.locked THEN {{fence}} END AS fence,
       g.prev_idle,
       CASE WHEN g.locked THEN set_config('idle_session_timeout', $4, false) END AS idle
FROM (
  SELECT pg_backend_pid() AS pid,
         k.key,
         current_setting('idle_session_timeout') AS prev_idle,
         CASE WHEN $3 <> 0 AND pg_backend_pid() <> $3 THEN NULL
              WHEN $2 THEN pg_advisory_lock(k.key) IS NOT NULL
              ELSE pg_try_advisory_lock(k.key)
         END AS locked
  FROM (SELECT hashtextextended($1, 0) AS key) AS k
  OFFSET 0
) AS g
