// Package redisqueue is the Redis backend of package
// [github.com/dlock/dlock/queue]: a delayed task queue on one Redis server
// (or Sentinel's failover client) or a Redis Cluster, every operation one
// Lua script on the queue's hash slot.
//
//	import _ "github.com/dlock/dlock/queue/redisqueue"
//
//	c, err := queue.Open(ctx, "redis://127.0.0.1:6379/0")
//
// or [NewQueue](client, opts) on the application's *goredis.Client or
// *goredis.ClusterClient (with ContextTimeoutEnabled); closing the Client
// leaves the application's client open.
//
// # URLs
//
//	redis://[user:password@]host:port[/db][?prefix=P]
//	rediss://…          the same over TLS
//
// The lock driver's URL form (package [github.com/dlock/dlock/redis]: TLS
// and go-redis's own parameters), with prefix the key prefix
// ([QueueOptions].KeyPrefix, default [DefaultQueuePrefix]); lock options are
// accepted and ignored, compat=true is refused.
//
// # Guarantees
//
// Package queue's semantics: due times and claim deadlines on the server's
// clock, to the millisecond, rounded the safe way; each operation atomic on
// the server; waiting Claims and Pops woken by pub/sub (one subscription
// connection per Client), published only while some Client waits on the
// queue, each change waking one waiter of each waiting Client. Tasks are as
// durable as the server's data: a
// restart without persistence, or a failover to a replica that had not yet
// received a write, loses that write (an enqueue, or an ack: the task is
// delivered again).
//
// The keys and scripts are described in the backends' [DESIGN.md].
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/queue/DESIGN.md
package redisqueue
