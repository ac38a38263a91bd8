-- metadata.sql: record a lock's Options.Metadata (Request.Metadata) for its
-- holder's session, so that Inspect, and leader election, can tell who holds
-- the lock. Run on the lease's session right after a grant whose metadata
-- is not empty (never for a lease without metadata: the lock's path stays
-- as it is). One row per session, dlock_metadata by default in the fencing
-- schema (fence.go creates it):
--
--   pid, backend_start  the holder's session: a row is the lease's only
--                       while that session lives and holds the lock (Inspect
--                       joins pg_locks and pg_stat_activity on both)
--   key                 the key text, KeyPrefix || name
--   fence, since        the grant's fencing token, and when it was granted
--   metadata            the lease's metadata
--
-- Rows of sessions that ended without a release (a crash, an expiry) are
-- deleted by the next metadata grant in the database (SKIP LOCKED: two
-- grants never wait for each other there); the lease's release deletes its
-- own (metadata_drop.sql). A row is kept when pg_stat_activity hides the
-- session's backend_start from this role (another role's session).
--
-- The lock's watchers (Watch, for Locker.Observe) are notified once the row
-- is committed: between the grant and this statement, Inspect shows the
-- lock held with no metadata, and a watcher that looked then looks again.
--
-- Placeholder {{table}}: the table, quoted and schema-qualified.
--
-- Parameters:
--   $1 text  the key text
--   $2 int8  the fencing token
--   $3 text  the metadata
WITH stale AS (
  DELETE FROM {{table}} WHERE pid IN (
    SELECT m.pid FROM {{table}} m
    WHERE m.pid <> pg_backend_pid()
      AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                      WHERE a.pid = m.pid AND (a.backend_start IS NULL OR a.backend_start = m.backend_start))
    FOR UPDATE SKIP LOCKED)
), stored AS (
  INSERT INTO {{table}} (pid, backend_start, key, fence, since, metadata)
  SELECT pg_backend_pid(), a.backend_start, $1, $2, now(), $3
  FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
  ON CONFLICT (pid) DO UPDATE
  SET backend_start = excluded.backend_start, key = excluded.key, fence = excluded.fence,
      since = excluded.since, metadata = excluded.metadata
)
SELECT pg_notify('dlock_lock_' || to_hex(hashtextextended($1, 0)), '')
