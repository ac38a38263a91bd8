-- permit.sql: take one of a semaphore's permits, if one is free, and set the
-- session up as the lease's (idle_session_timeout = TTL, synchronous_commit
-- off), as acquire.sql does for a lock. A permit is one of Limit slots, each
-- an advisory lock on a pair of int4 keys; the holder also holds a shared
-- lock on the key of its limit, which is how another limit is detected.
-- Keys (see kinds.go and the package doc, Layout), with $1 the key text:
--
--   slot i   (hi32(hs), lo16(hs) << 16 | i),      hs = hashtextextended($1, 3)
--   limit N  (hi32(hl), lo16(hl) << 16 | N - 1),  hl = hashtextextended($1, 4)
--
-- where hi32 is the top 32 bits, lo16 the 16 bits below them.
--
-- Parameters:
--   $1 text  the key text: the Locker's key prefix followed by the name
--   $2 int4  the backend pid the connection announced (0: no check)
--   $3 text  the lease's idle_session_timeout, in milliseconds: the TTL
--   $4 int4  the semaphore's limit
--
-- Placeholders (in double braces), replaced once per Locker:
--   unqueue  for a waiting Acquire, the unlock of the semaphore's queue key
--            (permit_queue.sql) once a permit is taken; nothing otherwise
--   fence    nextval of the fencing sequence, or 0 without fencing
--
-- Returns one row:
--   pid        int4    pg_backend_pid()
--   prev_idle  text    the settings before, as acquire.sql
--   prev_sync  text
--   fence      int8    granted: the fencing token (0 without fencing); -1:
--                      every slot is held; NULL: the pid did not match, or
--                      another limit (see slot)
--   waited     float8  seconds from the statement's start to its end
--   slot       int4    the slot taken (0 to $4 - 1); -1: none free; below
--                      -1: a permit of the name is held (or asked for, this
--                      very moment) under the limit -slot - 1, and nothing
--                      was taken; NULL: the pid did not match
--
-- The inner query takes, in this order (its target list is evaluated in
-- order; OFFSET 0 keeps it from being merged into the outer one, which
-- must see its slot once): the limit's key, shared; then it looks for
-- another limit's key of the name in pg_locks (and gives its own back if
-- there is one); then the first free slot, each pg_try_advisory_lock in turn
-- until one succeeds (LIMIT 1 stops the scan there); and gives the limit's
-- key back if none was free. Since every newcomer takes its limit's key
-- before it looks, of two that ask at once under different limits at least
-- one sees the other. The outer query sets the session up only once a slot
-- is taken, then takes the fencing token.
SELECT t.pid, t.prev_idle, t.prev_sync,
       CASE WHEN t.slot IS NULL OR t.slot < -1 THEN NULL
            WHEN t.slot = -1 THEN -1::int8
            WHEN set_config('idle_session_timeout', $3, false) IS NULL THEN NULL
            WHEN set_config('synchronous_commit', 'off', false) IS NULL THEN NULL
            {{unqueue}}
            ELSE {{fence}}
       END AS fence,
       date_part('epoch', clock_timestamp() - statement_timestamp()) AS waited,
       t.slot
FROM (
  SELECT pg_backend_pid() AS pid,
         current_setting('idle_session_timeout') AS prev_idle,
         current_setting('synchronous_commit') AS prev_sync,
         CASE WHEN $2 <> 0 AND pg_backend_pid() <> $2 THEN NULL
              WHEN NOT pg_try_advisory_lock_shared(
                     (hashtextextended($1, 4) >> 32)::bit(32)::int4,
                     ((((hashtextextended($1, 4) >> 16) & 65535) << 16) | ($4 - 1))::bit(32)::int4) THEN -1
              ELSE coalesce(
                (SELECT -1 - m.held FROM (
                   SELECT (l.objid::int8 & 65535)::int4 + 1 AS held FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.objsubid = 2
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND l.classid = ((hashtextextended($1, 4) >> 32) & 4294967295)::oid
                     AND (l.objid::int8 >> 16) = ((hashtextextended($1, 4) >> 16) & 65535)
                     AND (l.objid::int8 & 65535) <> $4 - 1
                   LIMIT 1) m
                 WHERE pg_advisory_unlock_shared(
                     (hashtextextended($1, 4) >> 32)::bit(32)::int4,
                     ((((hashtextextended($1, 4) >> 16) & 65535) << 16) | ($4 - 1))::bit(32)::int4)),
                (SELECT i FROM generate_series(0, $4 - 1) AS i
                 WHERE pg_try_advisory_lock(
                     (hashtextextended($1, 3) >> 32)::bit(32)::int4,
                     ((((hashtextextended($1, 3) >> 16) & 65535) << 16) | i)::bit(32)::int4)
                 LIMIT 1),
                CASE WHEN pg_advisory_unlock_shared(
                     (hashtextextended($1, 4) >> 32)::bit(32)::int4,
                     ((((hashtextextended($1, 4) >> 16) & 65535) << 16) | ($4 - 1))::bit(32)::int4) THEN -1 ELSE -1 END)
         END AS slot
  OFFSET 0
) t
