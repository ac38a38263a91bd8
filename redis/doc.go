// Package redis is the dlock driver for a single Redis server, one primary
// with replicas (Sentinel) or a Redis Cluster, built on
// github.com/redis/go-redis/v9: the fastest backend, with fencing tokens and
// FIFO handoff to queued waiters.
//
//	import _ "github.com/dlock/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
//
// or, on the application's *goredis.Client (one server, or Sentinel's
// failover client) or *goredis.ClusterClient, made with ContextTimeoutEnabled
// (a *goredis.Ring is refused):
//
//	locker, err := redis.New(client, nil)
//
// Code that imports both this package and go-redis names go-redis goredis.
//
// # URLs
//
//	redis://[user:pass@]host:port[/db][?params]
//	rediss://[user:pass@]host:port[/db]?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// Parameters: the lock options of [dlock.Options] (ttl, refresh,
// refresh_interval, retry_min, retry_max, metadata); prefix
// ([Options.KeyPrefix]); compat=true ([Options.Compat]); for rediss, tls_ca,
// tls_cert, tls_key, tls_server_name and tls_insecure_skip_verify (tests
// only); and go-redis's own (dial_timeout, pool_size, max_retries, …).
// Unknown parameters are rejected. [dlock.Open] pings the server, and the
// Locker closes the client it made. An ACL user needs the scripting commands,
// the keys ~P* and the channels &P* (P the key prefix).
//
// # Guarantees
//
//   - Exclusive while valid on the one node that decides; a failover to an
//     asynchronously replicated replica can lose or duplicate a lock, and
//     locks survive a restart only with AOF persistence.
//     [Options.MinReplicas] (URL min_replicas=N) narrows the failover
//     window: a grant and each refresh count only once WAIT reports N
//     replicas have them. WAIT is not consensus; fencing closes the window.
//   - Fencing ([dlock.Lease.Fence]): a counter per name, advanced by every
//     grant, increasing across a restart (not across a failover).
//   - FIFO: the release script hands the lock to the next queued waiter.
//   - Semaphores (fenced), read/write locks (writers fenced, a waiting writer
//     keeps new readers out) and leader election: default layout only.
//
// # Layout
//
// With P the key prefix ([DefaultKeyPrefix]) and N the lock name, a lock is
// the string P{N} holding the lease's token (SET NX PX), beside P{N}:fence,
// P{N}:queue and P{N}:waiters. With compat=true it is the key PN (P
// defaults to ""), the layout of redsync (one pool) and bsm/redislock: their
// locks and dlock's on one name exclude each other (no fencing, no FIFO).
// The records of [dlock.Locker.Once] are the strings P{N}:record (default
// layout only).
//
// [DESIGN.md] beside this package has the rest: every key of every kind, the
// scripts, fencing across restarts, waiting and handoff, costs and faults.
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/redis/DESIGN.md
package redis
