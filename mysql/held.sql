-- held.sql: whether this session holds a user-level lock.
-- Parameter 1: the lock's name on the server (LockName).
-- Returns 1 when it does, 0 when another session does, NULL when nobody does.
SELECT IS_USED_LOCK(?) = CONNECTION_ID()
