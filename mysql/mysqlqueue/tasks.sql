-- tasks.sql: the task-queue table (package queue), created on first use;
-- an administrator may run this DDL instead (with the table's name in
-- place of $TABLE). No parameters. One row per task:
--
--   queue, id   the queue's name and the task's id (bytes: compared
--               exactly, whatever the database's collation)
--   state       0 waiting, 1 claimed, 2 dead
--   due         waiting: when it is due; claimed: the claim's deadline;
--               dead: when it died (ms since the Unix epoch, the server's
--               UTC clock)
--   payload     the task's data (queue.MaxPayload is 1 MiB)
--   attempts    deliveries by Claim so far
--   token       claimed: the claim's token
--
-- The index serves every query with an index range: the due waiting tasks
-- in due order (Claim, Pop, Peek: the first n, locked with FOR UPDATE
-- SKIP LOCKED), the expired claims, the dead in order, and the next due
-- time (MIN(due) of a state: one index dive). Names are at most 512 bytes
-- (dlock.MaxNameLen), so both keys fit InnoDB's 3072-byte limit.
CREATE TABLE IF NOT EXISTS $TABLE (
  queue    VARBINARY(512) NOT NULL,
  id       VARBINARY(512) NOT NULL,
  state    TINYINT        NOT NULL DEFAULT 0,
  due      BIGINT         NOT NULL,
  payload  MEDIUMBLOB     NOT NULL,
  attempts INT            NOT NULL DEFAULT 0,
  token    VARBINARY(32)  NULL,
  PRIMARY KEY (queue, id),
  KEY state_due (queue, state, due, id)
) ENGINE = InnoDB
