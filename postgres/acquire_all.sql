-- acquire_all.sql: TryAcquireAll, every lock of a list or none, in one
-- statement on a shared session (all.go).
--
-- Parameters:
--   $1  int4    the session's backend pid, or 0 (no check; SessionPooler):
--               on another backend nothing is tried
--   $2  text[]  the key texts (KeyPrefix || name), sorted, distinct
--
-- Returns one row per key, in the order of $2:
--   pid    int4  pg_backend_pid()
--   fence  int8  all granted: the fencing token (0 without fencing);
--                -1: the first key held by someone else; -2: taken, then
--                given back since a later key was busy; -3: given back, but
--                pg_advisory_unlock found it not held (the session's state
--                is not what the driver thinks); NULL: not tried
--   key    int8  the advisory key, hashtextextended(key text, 0), which a
--                lease's release unlocks by a fast-path call (fastUnlock)
--
-- The recursive term runs once per iteration on the one row the last one
-- left, so the try-locks run in the order of $2 and stop at the first that
-- fails. n, an aggregate over every row of try, has its one row only once
-- the tries are over, so each output row's CASE sees their outcome before it
-- runs: it unlocks what was taken when not everything was (advisory session
-- locks ignore rollbacks), or takes the fencing token of each key once all
-- are held. CASE evaluates its conditions in order, and a branch only when
-- its condition holds.
WITH RECURSIVE try(i, ok) AS (
    SELECT 0, $1 = 0 OR pg_backend_pid() = $1
  UNION ALL
    SELECT try.i + 1, pg_try_advisory_lock(hashtextextended(($2::text[])[try.i + 1], 0))
    FROM try
    WHERE try.ok AND try.i < cardinality($2::text[])
), n AS MATERIALIZED (
    SELECT coalesce(max(i) FILTER (WHERE ok), -1) AS taken FROM try
)
SELECT pg_backend_pid() AS pid,
       CASE WHEN n.taken = cardinality($2::text[]) THEN {{fence}}
            WHEN u.i <= n.taken THEN
              CASE WHEN pg_advisory_unlock(hashtextextended(u.k, 0)) THEN -2::int8 ELSE -3::int8 END
            WHEN u.i = n.taken + 1 AND n.taken >= 0 THEN -1::int8
       END AS fence,
       hashtextextended(u.k, 0) AS key
FROM n, unnest($2::text[]) WITH ORDINALITY AS u(k, i)
ORDER BY u.i
