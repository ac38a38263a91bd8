-- tasks.sql: the task-queue table (package queue), created on first use;
-- an administrator may run this DDL instead (with the table's name in
-- place of dlock_tasks). One row per task:
--
--   queue, id   the queue's name and the task's id
--   state       0 waiting, 1 claimed, 2 dead
--   due         waiting: when it is due; claimed: the claim's deadline;
--               dead: when it died (the server's clock, to the ms)
--   payload     the task's data
--   attempts    deliveries by Claim so far
--   token       claimed: the claim's token
--
-- The index serves every query with an index range: the due waiting tasks
-- in due order (Claim, Pop, Peek: O(log n) to the first, then as many as
-- taken, also at 1M queued), the expired claims, the dead in order.
CREATE TABLE IF NOT EXISTS dlock_tasks (
  queue    text     NOT NULL,
  id       text     NOT NULL,
  state    smallint NOT NULL DEFAULT 0,
  due      timestamptz NOT NULL,
  payload  bytea    NOT NULL,
  attempts integer  NOT NULL DEFAULT 0,
  token    text,
  PRIMARY KEY (queue, id)
);
CREATE INDEX IF NOT EXISTS dlock_tasks_state_due ON dlock_tasks (queue, state, due, id);
