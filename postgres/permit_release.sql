-- permit_release.sql: give a permit back on the lease's own session, wake
-- the semaphore's waiting head, and give the session its settings back, as
-- release.sql does for a lock.
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is unlocked on another backend
--   $2 text  the key text (permit.sql's $1)
--   $3 text  the idle_session_timeout and
--   $4 text  the synchronous_commit to restore
--   $5 int4  the slot held
--   $6 int4  the semaphore's limit
--
-- Returns one row: unlocked bool (false when this session did not hold the
-- slot: nothing else is done; NULL on another backend). The NOTIFY
-- (pg_notify) is sent when the statement's transaction commits, after the
-- unlock: a waiting head that hears it finds the slot free.
SELECT CASE WHEN pg_backend_pid() = $1 THEN
         CASE WHEN pg_advisory_unlock(
                (hashtextextended($2, 3) >> 32)::bit(32)::int4,
                ((((hashtextextended($2, 3) >> 16) & 65535) << 16) | $5)::bit(32)::int4) THEN
                pg_advisory_unlock_shared(
                  (hashtextextended($2, 4) >> 32)::bit(32)::int4,
                  ((((hashtextextended($2, 4) >> 16) & 65535) << 16) | ($6 - 1))::bit(32)::int4) IS NOT NULL
                AND pg_notify('dlock_permit_' || to_hex(hashtextextended($2, 2)), '') IS NOT NULL
                AND set_config('idle_session_timeout', $3, false) IS NOT NULL
                AND set_config('synchronous_commit', $4, false) IS NOT NULL
              ELSE false END
       END AS unlocked
