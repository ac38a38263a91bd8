-- metadata_drop.sql: forget the metadata of the lease's session
-- (metadata.sql), before its release unlocks the lock.
--
-- Placeholder {{table}}: the table, quoted and schema-qualified.
DELETE FROM {{table}} WHERE pid = pg_backend_pid()
