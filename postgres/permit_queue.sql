-- permit_queue.sql: queue for a semaphore (a waiting Acquire): wait in the
-- server's FIFO queue of the semaphore's queue key, an advisory lock that
-- the waiter at the head of the queue holds while it waits for a permit
-- (see kinds.go). The head listens on the channel this returns, on which
-- every permit's release notifies (permit_release.sql).
--
-- Parameters:
--   $1 text  the key text: the Locker's key prefix followed by the name
--
-- Returns one row: channel text, 'dlock_permit_' and the queue key in hex.
SELECT CASE WHEN pg_advisory_lock(hashtextextended($1, 2)) IS NOT NULL
            THEN 'dlock_permit_' || to_hex(hashtextextended($1, 2)) END AS channel
