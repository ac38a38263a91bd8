-- metadata_drop.sql: forget the metadata of the lease's session
-- (metadata.sql) once its release unlocked the lock, and tell the lock's
-- watchers (Watch, which Locker.Observe uses) that it was released: the
-- notification is sent as this statement commits, after the unlock, so a
-- watcher that looks then finds the lock free, or its next holder. A
-- connection whose row this could not delete is closed, never reused.
--
-- Placeholder {{table}}: the table, quoted and schema-qualified.
--
-- Parameters:
--   $1 text  the key text
WITH gone AS (DELETE FROM {{table}} WHERE pid = pg_backend_pid())
SELECT pg_notify('dlock_lock_' || to_hex(hashtextextended($1, 0)), '')
