-- release.sql: unlock the lease's advisory lock on its own session and give
-- the session its idle_session_timeout back, so that the connection can
-- return to the pool.
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is unlocked on another backend
--   $2 int8  the lock's key
--   $3 text  the idle_session_timeout to restore (acquire.sql's prev_idle)
--
-- Returns one row: pid int4, unlocked bool (pg_advisory_unlock's result: false
-- when this session did not hold the lock; NULL on another backend).
SELECT pg_backend_pid() AS pid,
       CASE WHEN pg_backend_pid() = $1 THEN pg_advisory_unlock($2::int8) END AS unlocked,
       CASE WHEN pg_backend_pid() = $1 THEN set_config('idle_session_timeout', $3, false) END AS idle
