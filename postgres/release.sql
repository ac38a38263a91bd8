-- release.sql: unlock the lease's advisory lock on its own session and give
-- the session its idle_session_timeout back, so that the connection can
-- return to the pool.
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is unlocked on another backend
--   $2 text  the key text (acquire.sql's $1): the lock's key is
--            hashtextextended($2, 0)
--   $3 text  the idle_session_timeout to restore (prev_idle of acquire.sql)
--
-- Returns one row: unlocked bool (pg_advisory_unlock's result: false when
-- this session did not hold the lock, and then the setting is left as it is,
-- the connection being closed anyway; NULL on another backend). The unlock
-- comes first (the nested CASE orders the two calls): a waiter is granted the
-- lock while this statement restores the setting.
SELECT CASE WHEN pg_backend_pid() = $1 THEN
         CASE WHEN pg_advisory_unlock(hashtextextended($2, 0)) THEN set_config('idle_session_timeout', $3, false) IS NOT NULL
              ELSE false END
       END AS unlocked
