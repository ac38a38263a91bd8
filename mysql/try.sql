-- try.sql: one attempt at a user-level lock, without waiting.
-- Parameter 1: the lock's name on the server (LockName).
-- Returns 1 when this session now holds it, 0 when another session does,
-- NULL on an error (the session was killed).
SELECT GET_LOCK(?, 0)
