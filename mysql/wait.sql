-- wait.sql: waits on the server for a user-level lock, woken by its
-- release (or its holder's session ending).
-- $KEY: the lock's name on the server (LockName), as a literal; $SECS: how
-- long the server waits at most, in seconds; $MARK: a random hex mark of
-- this wait, in the column's name, which kill.sql finds in the process
-- list.
-- Returns 1 when this session now holds the lock, 0 when the wait timed
-- out, NULL on an error (the wait was killed).
SELECT GET_LOCK($KEY, $SECS) AS `dlock wait $MARK`
