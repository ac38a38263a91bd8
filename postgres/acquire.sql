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
--   take   the WHEN clauses that take the lock (see sql.go). For
--          Acquire: set the session up, then wait in pg_advisory_lock, the
--          server's FIFO queue, until granted or cancelled; for TryAcquire,
--          one pg_try_advisory_lock, then set the session up if granted.
--          Setting the session up is idle_session_timeout at $3 and
--          synchronous_commit off, for the session (set_config, not local);
--          a connection the driver kept from a lease of the same TTL (see
--          driver.park) is set up already, and its variant of the statement
--          leaves set_config out: on PostgreSQL 15, a transaction that
--          changed a setting walks every setting at its end.
--   fence  (inside take) nextval of the fencing sequence (see fence.go), or
--          0 without fencing (and for a reader).
--   key    the advisory key of the object taken: hashtextextended($1, 0) for
--          a lock, hashtextextended($1, 1) for a read/write lock, whose
--          {{take}} uses the _shared functions for a reader (see kinds.go).
--   prev   the prev_ columns below: current_setting of both settings, or
--          NULLs in the Kept variants (the driver has the values from
--          before it set the session up).
--
-- Returns one row:
--   pid        int4    pg_backend_pid()
--   prev_idle  text    idle_session_timeout before this statement, and
--   prev_sync  text    synchronous_commit: what the session gets back before
--                      it returns to the pool
--   fence      int8    granted: the fencing token (0 without fencing); -1:
--                      held by someone else; NULL: the pid did not match
--                      (nothing tried)
--   waited     float8  seconds from the statement's start to the end of the
--                      grant, on the server's clock
--   key        int8    the advisory key taken ({{key}}): for a lock,
--                      hashtextextended($1, 0), which the release of a parked
--                      connection unlocks by a fast-path call (see fastUnlock)
--
-- One Result node, no subquery. The target list is evaluated in order, so
-- the prev_ columns are read before the session is set up and waited after
-- the grant; CASE evaluates its conditions in order, and a branch only when
-- its condition holds (set_config never returns NULL: those WHENs only order
-- the calls). Little runs between the grant and the answer, since a
-- contended lock is passed on no faster than its holders answer: the
-- waiting variant sets the session up before it queues (a session running a
-- statement is not idle, and a failed statement rolls set_config back with
-- its implicit transaction), and the fencing token, taken once the lock is
-- granted so that tokens follow grant order, is the only work after the
-- grant.
--
-- synchronous_commit is off for the lease's session: nextval writes WAL
-- every 32nd value, and the commit would then wait for a flush while the
-- lock is held. A crash may therefore take back the last values handed out;
-- the fencing epoch (fence.go) moves the sequence past them.
SELECT pg_backend_pid() AS pid,
       {{prev}}
       CASE WHEN $2 <> 0 AND pg_backend_pid() <> $2 THEN NULL
            {{take}}
            ELSE -1
       END AS fence,
       date_part('epoch', clock_timestamp() - statement_timestamp()) AS waited,
       {{key}} AS key
