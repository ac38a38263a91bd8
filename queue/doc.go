// Package queue is a delayed task queue on Redis, PostgreSQL or in process,
// with dlock's conventions: opened from a URL or from the application's own
// client, every operation atomic on the server, a public conformance suite
// every driver passes.
//
//	c, err := queue.Open(ctx, "redis://127.0.0.1:6379/0") // or postgres://…, mem://
//	if err != nil { ... }
//	defer c.Close()
//	orders, _ := c.Queue("orders", nil)
//	orders.Enqueue(ctx, "order-42", &queue.EnqueueOptions{Delay: time.Minute, Payload: data})
//
//	claims, err := orders.ClaimWait(ctx, 10, 30*time.Second) // blocks, woken by the server
//	for _, cl := range claims {
//		if err := process(cl.Payload); err != nil {
//			cl.Nack(ctx, 5*time.Second) // again in 5s (dead-lettered after MaxAttempts)
//			continue
//		}
//		cl.Ack(ctx) // removes the task, unless the claim ran out meanwhile (ErrClaimLost)
//	}
//
// Import the backend's package for its scheme, as database/sql's drivers
// are imported: [github.com/dlock/dlock/queue/redisqueue] (redis://,
// rediss://; also a Redis Cluster through redisqueue.NewQueue),
// [github.com/dlock/dlock/queue/pgqueue] (postgres://, postgresql://),
// [github.com/dlock/dlock/queue/memqueue] (mem://), and, in the module
// github.com/dlock/dlock/mysql, github.com/dlock/dlock/mysql/mysqlqueue
// (mysql://, MariaDB 10.6+ and MySQL 8.0+, waiting by polling):
//
//	import _ "github.com/dlock/dlock/queue/redisqueue"
//
// The lock drivers (dlock/redis, dlock/postgres, dlock/memory) do not link
// the queue. etcd and ZooKeeper are not queue backends: they are built to
// coordinate, not to hold a backlog of tasks.
//
// # Semantics
//
//   - A task has an id (validated as lock names are), a due time, a payload
//     of at most [MaxPayload] (1 MiB) and an attempt count.
//   - [Queue.Enqueue] deduplicates: an id already queued (due, delayed or
//     claimed) keeps its place and payload, unless [EnqueueOptions] ask to
//     Replace (payload and due time) or Reschedule (due time) it; the result
//     says which happened. Either ends a current claim on it.
//   - Due times are the server's clock: a task is never delivered before it
//     is due, whatever the clients' clocks say, nor, delayed, before its
//     enqueue's send time + Delay (due times are rounded up to the ms).
//   - [Queue.Peek] shows due tasks in due order; [Queue.Pop] takes them at
//     once (at most once: a worker that crashes after Pop has lost them).
//   - [Queue.Claim] takes them for a visibility timeout (at least once):
//     [Claim.Ack] removes the task only while the claim is current; a claim
//     that runs out makes the task due again, delivered to the next Claim
//     with its Attempts raised; after [Options].MaxAttempts deliveries it is
//     dead-lettered ([Queue.Dead] lists, [Queue.Requeue] moves back). No two
//     claims on one task are current at once. [Claim.Until] is counted from
//     before the request was sent and rounded down, the server's deadline
//     from its receipt and rounded up, so the server's deadline is no
//     earlier.
//   - [Queue.Delete](id, due) is a compare-and-remove: it removes a waiting
//     task only if it is still due at the time the caller read.
//   - [Queue.PopWait] and [Queue.ClaimWait] block until a task is there,
//     woken by the server (Redis pub/sub, PostgreSQL LISTEN/NOTIFY) when one
//     is enqueued, nacked or requeued, and by a timer when the next one
//     becomes due; a missed wake-up costs at most 5s.
//   - Bad input (an invalid id, n outside 1..[MaxBatch], a negative delay, an
//     oversized payload, a zero visibility) is [ErrInvalid] before any I/O.
//     An error from any other call leaves every task where it was or where
//     the call atomically put it.
//
// Drivers implement package [github.com/dlock/dlock/queue/driver] and pass
// [github.com/dlock/dlock/queue/conformance] against a real server. What each
// backend stores on its server is in [DESIGN.md].
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/queue/DESIGN.md
package queue
