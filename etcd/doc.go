// Package etcd is the dlock driver for etcd v3: locks that survive a member
// failure and a leader change, granted in FIFO order and fenced by the lock
// key's create revision; semaphores, read/write locks and leader elections
// on the same queue design.
//
//	import _ "github.com/dlock/dlock/etcd"
//
//	locker, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks/?ttl=10s")
//
// or, on the application's *clientv3.Client:
//
//	locker, err := etcd.New(client, &etcd.Options{KeyPrefix: "/locks/"})
//
// # URLs
//
//	etcd://[user:pass@]host1:2379[,host2:2379,…][/prefix][?params]
//	etcds://[user:pass@]host1:2379[,…][/prefix]?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// The path is the key prefix (default [DefaultKeyPrefix]); user and password
// turn on authentication (read and write permission on the prefix needed).
// Parameters: the lock
// options of [dlock.Options] (ttl, refresh, refresh_interval, retry_min,
// retry_max, metadata); dial_timeout, dial_keep_alive_time,
// dial_keep_alive_timeout, auto_sync_interval, lease_per_lock
// ([Options.LeasePerLock]); for etcds, tls_ca, tls_cert, tls_key,
// tls_server_name and tls_insecure_skip_verify (tests only). Unknown
// parameters are rejected. [ParseURL] gives the client configuration a URL
// stands for.
//
// # Guarantees
//
//   - Exclusive while valid: lock keys are committed on a Raft quorum and
//     survive a minority of members down, a leader change and a restart.
//   - Fencing ([dlock.Lease.Fence]): the lock key's create revision.
//   - FIFO with no herd: a waiter makes no read and no watch of its own;
//     the Locker's one watch tells it when the last older key is gone.
//   - A holder cut off from the quorum reports the loss at ValidUntil.
//   - TTLs are whole seconds, at least [MinTTL], raised by etcd to its
//     minimum (2s by default); [dlock.Lease.TTL] reports the TTL granted.
//   - Semaphores, read/write locks and elections: FIFO, fenced by create
//     revision (permits, writers, an election's term).
//   - [dlock.Locker.TryAcquireAll] (and an uncontended AcquireAll) is one
//     transaction for up to 128 names (etcd's default --max-txn-ops), all
//     or none, every name fenced by its revision; more go one by one.
//   - No [dlock.Locker.Steal] (errors.ErrUnsupported): the queue's order
//     and the fence are both a key's create revision, fixed when it is put,
//     so a stealer's fence above the holder's would be above every queued
//     waiter's too, and fences would go backwards at the next hand-off
//     (DESIGN.md says why each way round fails, and what would work).
//
// # Layout
//
// A lease or waiter is a key under the prefix P and the escaped name N; the
// holder is the key with the lowest create revision under "P N/": the layout
// of concurrency.Mutex and `etcdctl lock`, which exclude dlock's locks on
// [MutexName](P, N) in one FIFO queue. Read/write locks share recipe.RWMutex's
// layout ([RWMutexName]; mind the caveat in DESIGN.md), elections
// concurrency.Election's. The records of [dlock.Locker.Once] are the keys
// P%record/N, each on an etcd lease of its retention.
//
// [DESIGN.md] beside this package has the rest: the shared etcd lease and
// watch, refresh and loss, faults, the primitives, and every key.
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/etcd/DESIGN.md
package etcd
