-- refresh.sql: extend a held lease. Any statement restarts the session's idle
-- timer; this one also sets idle_session_timeout to the new TTL.
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is changed on another backend
--            (a transaction pooler handing the statement to another session)
--   $2 text  the new idle_session_timeout, in milliseconds
--
-- Returns one row: pid int4 (pg_backend_pid()), then the setting as set.
SELECT pg_backend_pid() AS pid,
       CASE WHEN pg_backend_pid() = $1 THEN set_config('idle_session_timeout', $2, false) END AS idle
