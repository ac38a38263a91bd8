-- record.sql: write a lock's record (dlock.Once's completion marker) on the
-- session that holds the lock, only if it holds it: the check of pg_locks and
-- the upsert are one statement, one transaction. The commit is made durable
-- (synchronous_commit as the role's default, at least local) although the
-- lease's session runs with it off. A few expired records go with it.
--
-- Placeholders: {{table}} the records table; {{match}} the pg_locks match of
-- the lock's key (held.sql's).
--
-- Parameters:
--   $1 int4  the lease's backend pid: nothing is written on another backend
--   $2 text  the key text (acquire.sql's $1), also the record's key
--   $3 text  idle_session_timeout, in milliseconds: the lease's time left
--            (see held.sql)
--   $4 text  the record's value
--   $5 int8  how long to keep it, in milliseconds
--
-- Returns one row: pid int4, written bool (NULL on another backend), the
-- settings.
WITH held AS (
  SELECT pg_backend_pid() = $1::int4 AND EXISTS (
           SELECT 1 FROM pg_locks
           WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
             AND {{match}}) AS held
), put AS (
  INSERT INTO {{table}} (key, value, expires)
  SELECT $2::text, $4::text, clock_timestamp() + $5::int8 * interval '1 millisecond'
  FROM held WHERE held
  ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires
  RETURNING 1
), swept AS (
  DELETE FROM {{table}} WHERE key IN (
    SELECT key FROM {{table}} WHERE expires < now() AND key <> $2::text
    LIMIT 16 FOR UPDATE SKIP LOCKED)
)
SELECT pg_backend_pid() AS pid,
       CASE WHEN pg_backend_pid() = $1::int4 THEN EXISTS (SELECT 1 FROM put) END AS written,
       CASE WHEN pg_backend_pid() = $1::int4 THEN set_config('idle_session_timeout', $3::text, false) END AS idle,
       set_config('synchronous_commit',
         (SELECT CASE reset_val WHEN 'off' THEN 'local' ELSE reset_val END
          FROM pg_settings WHERE name = 'synchronous_commit'), true) AS sync
