-- held.sql: does this session hold the lease's advisory lock? pg_locks shows a
-- 64-bit key as classid (high 32 bits) and objid (low 32 bits), objsubid 1;
-- a pair of int4 keys (a semaphore's) as classid and objid, objsubid 2.
-- Placeholder {{match}}: the conditions on those columns for the lease's
-- key (kinds.go): for a lock, objsubid 1 and hashtextextended($2, 0).
-- Running it restarts the session's idle timer; so that this does not extend
-- the lock past what the holder knows of, idle_session_timeout is set to the
-- time the lease has left (the next refresh sets the TTL again).
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is read or changed on another
--            backend
--   $2 text  the key text (acquire.sql's $1)
--   $3 text  idle_session_timeout, in milliseconds: the lease's time left
--   $4 int4  a permit's slot (see permit.sql); unused otherwise
--
-- Returns one row: pid int4, held bool (NULL on another backend), the setting.
SELECT pg_backend_pid() AS pid,
       CASE WHEN pg_backend_pid() = $1 THEN EXISTS (
         SELECT 1 FROM pg_locks
         WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
           AND {{match}})
       END AS held,
       CASE WHEN pg_backend_pid() = $1 THEN set_config('idle_session_timeout', $3, false) END AS idle
