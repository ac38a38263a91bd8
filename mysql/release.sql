-- release.sql: lets go of a user-level lock this session holds.
-- $KEY: the lock's name on the server (LockName), as a literal.
-- Returns 1 when it was this session's, 0 when another session's, NULL when
-- nobody held it.
SELECT RELEASE_LOCK($KEY)
