-- held.sql: whether this session holds a user-level lock.
-- $KEY: the lock's name on the server (LockName), as a literal.
-- Returns 1 when it does, 0 when another session does, NULL when nobody does.
SELECT IS_USED_LOCK($KEY) = CONNECTION_ID()
