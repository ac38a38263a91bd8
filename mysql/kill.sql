-- kill.sql: ends the session of a wait (wait.sql) that its client gave up
-- on: the client library closed the connection, which the server, busy in
-- GET_LOCK, notices late (about a second), or, when the close is lost on
-- the way, not before the wait ends, maybe with the lock.
-- Two statements, sent one by one (split on ";\n") on one connection.
-- $ID: the waiting session's connection id; $MARK: the wait's mark. The
-- first returns a row only while that session still runs that wait, so
-- that a connection id given out again (after a server restart) is not
-- ended; the second ends the session, and any lock it got.
SELECT ID FROM information_schema.PROCESSLIST
WHERE ID = $ID AND INFO LIKE '%dlock wait $MARK%';
KILL CONNECTION $ID
