-- idle.sql: how long the session holding a user lock has been idle, for the
-- hint of a busy attempt (MariaDB's TIME_MS; the user needs PROCESS to see
-- other users' sessions).
-- $KEY: the lock's name on the server (LockName), as a literal.
-- Returns the milliseconds since the holder's last statement ended, 0 while
-- it runs one; no row when nobody holds the lock.
SELECT IF(COMMAND = 'Sleep', TIME_MS, 0)
FROM information_schema.PROCESSLIST
WHERE ID = IS_USED_LOCK($KEY)
