-- inspect.sql: the sessions that hold or wait for a name's advisory lock in
-- this database (pg_locks shows a 64-bit key as classid, its high 32 bits,
-- and objid, its low 32 bits, with objsubid 1), with their backends.
--
-- Parameters:
--   $1 text  the key text: KeyPrefix || name
--
-- Returns a row per session: granted bool, pid int4, backend_start
-- timestamptz, application_name text (NULL when pg_stat_activity does not
-- show the session to this role).
SELECT l.granted, l.pid, a.backend_start, a.application_name
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
