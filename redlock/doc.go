// Package redlock is the dlock driver for Redlock: one lock over N
// independent Redis masters (N odd, at least 3), held while a majority of
// them hold it, built on github.com/redis/go-redis/v9.
//
//	import _ "github.com/dlock/dlock/redlock"
//
//	locker, err := dlock.Open(ctx, "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?ttl=10s")
//
// or, on the application's clients, one per master (a Cluster or Ring node is
// refused):
//
//	locker, err := redlock.New([]*goredis.Client{c1, c2, c3}, nil)
//
// # URLs
//
//	redlock://[user:pass@]host1:port1,host2:port2,host3:port3[/db][?params]
//	redlocks://[user:pass@]host1:port1,…?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// Every node gets the same credentials, database and settings; give every
// host its port. Parameters: the lock options of [dlock.Options] (ttl,
// refresh, refresh_interval, retry_min, retry_max, metadata); prefix, compat,
// node_timeout and drift ([Options]); for redlocks, the TLS parameters of the
// redis driver; and go-redis's own, applied to every node. Unknown parameters
// are rejected. [dlock.Open] fails unless a majority of nodes answers a ping.
//
// # Guarantees
//
//   - Exclusive while a majority of independent masters keeps the lock and
//     clocks run at about the same rate ([Options.Drift] covers the
//     difference): Redlock's timing assumptions.
//   - A minority of nodes down or paused changes nothing; with a majority
//     down acquisitions fail with [ErrNoQuorum] and leases end at ValidUntil.
//   - A node that restarts without its data must stay out for the longest TTL
//     in use (or run with appendonly yes, appendfsync always).
//   - Fencing ([dlock.Lease.Fence]): per-node counters, the token written back
//     to a majority before the grant.
//   - Waiting: a release grants the lock to the first queued waiter (about
//     FIFO); no split votes among waiters.
//   - No semaphores, read/write locks or elections: use the redis driver.
//
// # Layout
//
// On every node, with P the key prefix ([DefaultKeyPrefix]) and N the lock
// name, a lock is the string P{N} holding the lease's token (SET NX PX),
// beside P{N}:fence and P{N}:waiters; a redsync mutex named "dlock:{N}"
// excludes dlock's N. With compat=true the lock is the key PN (P defaults to
// ""), the layout of a github.com/go-redsync/redsync/v4 Mutex named PN over
// the same nodes, for a migration without stopping every process at once (no
// fencing). The records of [dlock.Locker.Once] are the strings P{N}:record
// on every node (default layout only), counted by majority as locks are.
//
// [DESIGN.md] beside this package has the rest: split votes, every failure
// and clock jump, fencing over independent nodes, the hand-off and why it is
// safe, every key, and why there are no semaphores.
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/redlock/DESIGN.md
package redlock
