// Package zookeeper is the dlock driver for Apache ZooKeeper, built on
// github.com/go-zookeeper/zk: a FIFO queue of ephemeral-sequential znodes,
// with fencing tokens and losses reported as soon as a session expires.
//
//	import _ "github.com/dlock/dlock/zookeeper"
//
//	locker, err := dlock.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/myapp/locks?ttl=10s")
//
// A ZooKeeper session's timeout is the lock's TTL: [Connect] (what Open uses)
// dials sessions of its own, one per distinct TTL. [New] runs every lock in
// the session of the application's *zk.Conn instead, with TTLs up to its
// timeout:
//
//	locker, err := zookeeper.New(conn, &zookeeper.Options{SessionTimeout: 10 * time.Second})
//
// # URLs
//
//	zk://[user:password@]host1:2181[,host2:2181,…][/root][?params]
//
// The hosts form the ensemble; the path is the root znode (default
// [DefaultRoot]); user and password are added to every session as digest
// credentials. Parameters: the lock options of [dlock.Options] (ttl, refresh,
// refresh_interval, retry_min, retry_max, metadata) and acl, the ACL of the
// znodes the driver creates: open, creator, read, or scheme:id:perms entries
// in zkCli's notation (default creator with credentials, open without).
// Unknown parameters are rejected.
//
// # Guarantees
//
//   - Exclusive while valid: ephemeral nodes and linearizable writes; locks
//     survive server restarts (the session resumes within its timeout).
//   - Fencing ([dlock.Lease.Fence]): the lock node's czxid.
//   - FIFO: each waiter watches only its predecessor (no herd).
//   - A cut-off holder's node lives until its session expires; the holder
//     reports the loss first. No node is left behind by a fault.
//   - Semaphores (FIFO, no permit fencing), read/write locks (writers fenced,
//     a waiting writer keeps new readers out) and leader election (the
//     candidate in the lock node's data).
//   - AcquireAll: one multi-op creates every name's node; a node alone
//     under its name is first, so an uncontended TryAcquireAll is one round
//     trip (the names whose node is not alone are listed; if one is not
//     first, one multi-op deletes every node and nothing is taken).
//   - No [dlock.Locker.Steal]: a node's fence is its czxid, fixed when it
//     joins the queue. A stealer's node, created at the steal and put ahead
//     of the waiters so that they keep their places, has a czxid above
//     theirs: each waiter queued before the steal would be granted after the
//     stealer with a lower fence, which a fenced store refuses. Keeping the
//     order needs the waiters to queue again (losing their places) or a
//     fence taken at each grant (a write per grant); neither is done.
//
// # Layout
//
// With R the root and N the lock name escaped, a lease or waiter is the
// ephemeral-sequential node R/N/_c_<guid>-lock-<seq> under the container node
// R/N ([LockPath]): the layout of Curator's InterProcessMutex and
// go-zookeeper's zk.Lock, which exclude dlock's locks on that path and queue
// with them. Read/write locks use Curator's InterProcessReadWriteLock layout
// at [RWLockPath]; semaphores live at [SemaphorePath]. The driver needs read,
// write, create and delete permissions on R/N. The records of
// [dlock.Locker.Once] are persistent nodes R/%records/N, deleted past their
// retention by the driver's later reads and sweeps.
//
// [DESIGN.md] beside this package has the rest: sessions and TTLs, refresh
// and expiry, disconnection and restart, cleanup, the primitives and every
// node.
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/zookeeper/DESIGN.md
package zookeeper
