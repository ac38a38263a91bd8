-- release.sql: unlock the lease's advisory lock on its own session and give
-- the session its settings back, so that the connection can return to the
-- pool.
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is unlocked on another backend
--   $2 text  the key text (acquire.sql's $1): a lock's key is
--            hashtextextended($2, 0)
--   $3 text  the idle_session_timeout and
--   $4 text  the synchronous_commit to restore (acquire.sql's prev_ columns)
--
-- Placeholder {{unlock}}: the unlock of the object's key, a bool:
-- pg_advisory_unlock(hashtextextended($2, 0)) for a lock; the read/write
-- lock's key, shared for a reader (see kinds.go).
--
-- Placeholder {{restore}}: the set_config calls that restore $3 and $4, or
-- nothing when the driver keeps the connection for its next lease (see
-- driver.park), and the sweep restores them later, off the lock's path.
--
-- Returns one row: unlocked bool (pg_advisory_unlock's result: false when
-- this session did not hold the lock, and then the settings are left as
-- they are, the connection being closed anyway; NULL on another backend).
-- The unlock comes first (the nested CASE orders the calls): a waiter is
-- granted the lock while this statement restores the settings.
SELECT CASE WHEN pg_backend_pid() = $1 THEN
         CASE WHEN {{unlock}} THEN {{restore}}
              ELSE false END
       END AS unlocked
