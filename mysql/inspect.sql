-- inspect.sql: who holds a user-level lock, for Inspect.
-- $KEY: the lock's name on the server (LockName), as a literal.
-- Returns one row: the holding session's connection id, NULL when nobody
-- holds the lock; and that session's user and host, NULL when this user
-- may not see it (another user's session needs the PROCESS privilege).
SELECT h.id, p.USER, p.HOST
FROM (SELECT IS_USED_LOCK($KEY) AS id) AS h
LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = h.id
