-- try.sql: one attempt at a user-level lock, without waiting.
-- $KEY: the lock's name on the server (LockName), as a literal.
-- Returns 1 when this session now holds it, 0 when another session does,
-- NULL on an error (the session was killed); and the session's connection
-- id (what IS_USED_LOCK returns for the holder, which Inspect matches).
SELECT GET_LOCK($KEY, 0), CONNECTION_ID()
