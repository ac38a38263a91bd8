-- inspect_metadata.sql: inspect.sql, with the holder's metadata, fencing
-- token and grant time from the metadata table (metadata.sql), when the
-- holder's session recorded them: a row counts only for the session that
-- holds the lock now (same pid and backend_start, same key).
--
-- Placeholder {{table}}: the table, quoted and schema-qualified.
--
-- Parameters:
--   $1 text  the key text: KeyPrefix || name
--
-- Returns inspect.sql's columns, then metadata text, fence int8 and since
-- timestamptz (NULL without a row).
SELECT l.granted, l.pid, a.backend_start, a.application_name, m.metadata, m.fence, m.since
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN {{table}} m ON l.granted AND m.pid = l.pid AND m.backend_start = a.backend_start AND m.key = $1
WHERE l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
