-- permit_queue.sql: queue for a semaphore (a waiting Acquire): wait in the
-- server's FIFO queue of the semaphore's queue key, an advisory lock that
-- the waiter at the head of the queue holds while it waits for a permit
-- (see kinds.go). The head listens on the channel this returns, on which
-- every permit's release notifies (permit_release.sql).
--
-- The session's idle_session_timeout becomes the TTL first, so that a head
-- whose process or network vanished does not hold the queue key past it:
-- a live head runs a statement at least every quarter TTL (its backoff).
-- The setting before is returned, for the permit's release to restore.
--
-- Parameters:
--   $1 text  the key text: the Locker's key prefix followed by the name
--   $2 text  idle_session_timeout, in milliseconds: the TTL
--
-- Returns one row: prev_idle text, the setting before; channel text,
-- 'dlock_permit_' and the queue key in hex.
SELECT current_setting('idle_session_timeout') AS prev_idle,
       CASE WHEN set_config('idle_session_timeout', $2, false) IS NOT NULL
             AND pg_advisory_lock(hashtextextended($1, 2)) IS NOT NULL
            THEN 'dlock_permit_' || to_hex(hashtextextended($1, 2)) END AS channel
