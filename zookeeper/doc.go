// Package zookeeper is the dlock driver for Apache ZooKeeper, built on
// github.com/go-zookeeper/zk: a FIFO queue of ephemeral-sequential znodes,
// with fencing tokens and losses reported as soon as a session expires.
//
//	import _ "github.com/dlock/dlock/zookeeper"
//
//	locker, err := dlock.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/myapp/locks?ttl=10s")
//
// Connect (what Open uses) dials sessions of its own, one per distinct TTL,
// since a ZooKeeper session's timeout is the lock's TTL. New runs every lock
// in the session of the application's *zk.Conn instead, with TTLs up to its
// timeout:
//
//	locker, err := zookeeper.New(conn, &zookeeper.Options{SessionTimeout: 10 * time.Second})
//
// Guarantees in brief:
//   - Exclusive while valid: ephemeral nodes and linearizable writes; locks
//     survive server restarts (the session resumes within its timeout).
//   - Fencing: the lock node's czxid.
//   - FIFO: each waiter watches only its predecessor (no herd).
//   - A cut-off holder's node lives until its session expires; the holder
//     reports the loss first. No node is left behind by a fault.
//   - Curator's InterProcessMutex and go-zookeeper's zk.Lock exclude dlock's
//     locks on the same path (see LockPath).
//   - Semaphores (FIFO), read/write locks (Curator's layout, writers
//     fenced, a waiting writer keeps new readers out) and leader election
//     (the candidate in the lock node's data): see Semaphores, Read/write
//     locks and Elections below.
//
// The sections below are the details.
//
// # URLs
//
//	zk://[user:password@]host1:2181[,host2:2181,…][/root][?params]
//
// The hosts form the ensemble (port 2181 when left out). The path is the
// root znode under which lock nodes live (default /dlock; see Layout). A
// user and password are added to every session as digest credentials.
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - acl: the ACL of the znodes the driver creates. open (world:anyone,
//     all permissions), creator (auth::cdrwa: only sessions with the same
//     credentials), read (creator, plus read for everyone), or a
//     comma-separated list of scheme:id:perms entries in zkCli's notation,
//     such as world:anyone:r,digest:app:HASH=:cdrwa or ip:10.0.0.0/8:cdrwa.
//     Default: creator with credentials in the URL, open without.
//
// Unknown parameters are rejected. Open connects, bounded by its ctx (see
// Connect), so a wrong address fails there. go-zookeeper's log output is
// discarded (Options.Logger turns it back on).
//
// # Guarantees
//
// Each lease is one ephemeral-sequential znode; the lowest one under a name
// holds the lock, and each waiter watches only its immediate predecessor, so
// waiters are granted in arrival order (Capabilities.FIFO) and a release wakes
// exactly one of them. The first waiter of a lock or a write lock (one node
// ahead of it) is granted on that node's deletion event itself, a round
// trip sooner than zk.Lock and Curator, which list the queue again: no node
// can come ahead of it (sequence numbers only grow, and a node the driver
// moves keeps its name but wakes its watcher with a write first), and an
// exists watch on its own node, set on the same connection, has not fired,
// so its node is still there (the server sends a connection's watch events
// in order). After a reconnection, on any other event, and on the
// application's connection (New), it lists the queue. Within one ensemble
// a lock is held by at most one session at a time: ZooKeeper's writes are
// linearizable, and an ephemeral node lives exactly as long as its session.
//
// The TTL is the session timeout. A Locker made by Connect runs one session
// per distinct TTL (its own TCP connection, shared by every lease and waiter
// with that TTL), asks the server for the TTL as the session timeout and
// reports the timeout the server negotiated as the lease's TTL; a TTL outside
// the server's minSessionTimeout..maxSessionTimeout is rejected with
// dlock.ErrInvalid (Capabilities.MinTTL is the server's minimum, learnt at
// Connect). Refresh with another TTL moves the lock node into a session with
// that timeout, atomically (one multi-op writes its data, deletes it and
// creates it again under the same name), keeping its place and its fencing
// token; the write comes first so that a waiter watching the node wakes to
// a change, not to a deletion (see below).
//
// The server drops a session, and its lock nodes, when it has not heard from
// it for the session timeout. go-zookeeper pings the server every third of
// it, whether or not leases are refreshed, so a lease that is not refreshed
// (NoRefresh, or a watchdog that cannot reach the server) has its node
// deleted by the driver once its TTL has passed since the last refresh was
// sent. A refresh checks that the lease's node is still there and still
// owned by the lease's session; the lease's ValidUntil counts from when it
// was sent (from when Acquire was called, for a lock granted without
// waiting), so it is never later than the moment the server could expire
// the session. Lease.Refresh reads the node. The watchdog refreshes the
// leases of a Connect session together, with one read of "/" per batch:
// each lease's node carries an exists watch, set by its first batched
// refresh (a read of the node), and the server delivers a connection's
// watch events in order with its replies, so every lease whose watch has
// not fired when that read returns still has its node. A watch counts only
// on the connection that set it: after a reconnection each lease sets it
// again. Holding 10,000 leases thus costs a few reads a second, not 10,000
// every third of the TTL.
//
// Concurrent acquisitions and releases on a session share requests: the
// creates and deletes asked for while requests are in flight go together
// in the next multi-op, each caller's operations still applied, or failed,
// on their own.
//
// Session states: while go-zookeeper is disconnected (suspended), refreshes
// fail and the lease stays valid until its ValidUntil, then reports loss; if
// the connection comes back in time the session, its nodes and the lease
// carry on. A server restart is survived the same way: standalone and
// ensemble servers keep sessions on disk, and the session timeout starts
// again when the server comes back (Capabilities.SurvivesRestart). When the
// server expired the session, its leases are lost as soon as the driver
// hears of it (go-zookeeper then opens a new session on the same connection;
// nothing of the old one is ever reported as held), and its waiters queue
// again at the end.
//
// What the server may keep after a holder's ValidUntil (ExpirySlack): a
// holder cut off from the server keeps its node until the session timeout
// after the server last heard from it, rounded up to the server's tick. With
// the watchdog on, that is at most RefreshInterval plus a tick after the
// lease's ValidUntil; a lease without refresh cut off just before its TTL
// runs out, up to a whole TTL more. Capabilities.ExpirySlack declares the
// server's minimum session timeout (two ticks by default), which covers the
// rounding to the tick and the lag of the server's expiry thread, not the
// refresh interval: a holder cut off just after a refresh keeps others out
// for up to RefreshInterval longer than ValidUntil + ExpirySlack (they are
// granted later, never earlier).
//
// The fencing token is the lock node's creation zxid (czxid): ZooKeeper's
// transaction ids strictly increase, so tokens follow grant order across
// holders, expiry takeovers and the name node's deletion; they are not
// consecutive. A process paused past its ValidUntil still believes it holds
// the lock until it runs again; pass Lease.Fence to the resource.
//
// Every lock node the driver creates is the live lease's, a live waiter's,
// or deleted, whatever the fault: a node nobody holds or waits on would sit
// in the queue, ahead of every later waiter, for as long as its session
// lives. A cancelled attempt or wait deletes its node before it returns
// (waiting up to half the TTL, at most a second, then carrying on in the
// background, through connection trouble, until the node is gone or its
// session ended: Curator's guaranteed delete). A create whose outcome was
// lost is found again by its GUID (Curator's protected mode), and any other
// node with the GUID is deleted; a create that go-zookeeper sent on a new
// session after the old one expired is taken as the new session's. When a
// session of the driver's own resumes after a disconnection, the names it
// has locks or waiters under are swept for nodes of the session that no
// lease or waiter tracks. A release whose delete fails leaves the lease
// valid until its ValidUntil, as dlock documents; the driver deletes the
// node then.
//
// go-zookeeper v1.0.4 has a data race on its Conn.lastZxid, between
// recvLoop and sendSetWatches, when a connection with watches comes back
// while replies arrive (upstream: go-zookeeper/zk pull request 35,
// samuel/go-zookeeper issue 260, open); a stale value there only has the
// server send watch events the client may already have seen, but the race
// detector reports it. The sessions the driver dials itself (Connect, Open)
// use a copy of go-zookeeper v1.0.4 with that one fix (internal/zk, until
// upstream releases it), whose types and errors are upstream's. A Locker
// made by New runs in the application's own *zk.Conn, which keeps
// upstream's race: under -race, the application's tests may see it after a
// reconnection.
//
// # Semaphores
//
// A semaphore is a queue like a lock's, under a node of its own (see
// Layout): each permit or waiter is one ephemeral-sequential node, and the
// first Limit nodes by sequence number hold permits. Everything above about
// sessions, TTLs, losses and cleanup holds for permits as for locks.
//
// The limit is part of each permit node's name, so that one listing shows
// every holder's limit without reading a node: a node that finds a node
// ahead of it with another limit deletes itself and fails with
// dlock.ErrLimitMismatch, waiting or not, having taken nothing. Two
// acquisitions racing with different limits on a free semaphore: the later
// one is refused. A node behind a refused one may be refused too while the
// refused node is still there (it deletes itself at once): only while
// someone uses a wrong limit.
//
// Waiting is FIFO and wakes no herd. The first waiter (exactly Limit nodes
// ahead of it) watches the children of the semaphore's node, since the next
// permit to come back may be any of the Limit ahead of it; a waiter further
// back watches its predecessor. A permit granted while nodes wait behind it
// writes its node's data once (the same data), which wakes the waiter
// behind it: that one is now first and watches the children. (Watching the
// node Limit places ahead would not do: a node in between may leave first,
// and the watcher, entitled to a permit, would sleep on.)
//
// Permits carry no fencing token (Capabilities.PermitFencing is false): a
// permit node's czxid follows arrival, not grant order — a newcomer can be
// granted a free permit before an older waiter, entitled too, has heard of
// its own grant.
//
// # Read/write locks
//
// Readers and writers queue under one node, as read nodes and write nodes
// named as Apache Curator's InterProcessReadWriteLock names them, so that
// Curator and dlock share a read/write lock at RWLockPath. A writer holds
// when it is first, and watches its predecessor; a reader holds when no
// write node is ahead of it, and watches the nearest write node ahead. A
// waiting writer's node is ahead of every later reader, so it keeps new
// readers out (TryRLock fails, RLock waits) from the moment it queues until
// it is granted or gives up (its node is deleted, waking the readers);
// readers already holding keep the lock until they release. (A TryLock's
// write node is there during its one attempt only; a TryRLock meanwhile
// fails as busy, as Curator's would.)
//
// A writer's fencing token is its write node's czxid: a writer is granted
// only once every node created before it is gone, so write grants follow
// czxid order. Readers' leases carry no token.
//
// # Elections
//
// Locker.Elect is a lock whose node's data is the candidate
// (Capabilities.Metadata): Inspect reports the first lock node's data as
// the leader, its czxid as the term, and its mtime as Since. A lock node
// with metadata that was granted after waiting writes its data again (the
// same data) when granted, so that Since is the grant, not the moment the
// candidate joined the queue: one write, in the background once Acquire has
// returned, which also makes the next waiter look again once. A lock
// without metadata is not written (a holder that waited reports the time
// it queued), and no lock granted at once is. Observe hears a leader's
// end at once: the driver watches the children of the lock's node
// (dlockdriver.Notifier), one server watch per name while it has not fired.
// A Refresh with another TTL moves the node (see above): Inspect then
// reports the moved node's czxid and mtime, while the lease keeps its
// token.
//
// A Locker made by New uses the application's *zk.Conn for everything: one
// session, so TTLs above its timeout are rejected, shorter ones are enforced
// by the driver, and a holder cut off from the server keeps its nodes for the
// session timeout (ExpirySlack). go-zookeeper does not tell the driver when
// that session expires; the driver finds out at the next refresh.
//
// # Layout
//
// With R the root (default /dlock) and N the lock name escaped into one path
// component (see LockPath):
//
//	R                          persistent, created when missing
//	R/N                        container node: the server deletes it once it
//	                           is empty (znode.container.checkIntervalMs, a
//	                           minute by default)
//	R/N/_c_<guid>-lock-<seq>   ephemeral-sequential: one per lease or waiter;
//	                           the GUID is the lease's token, the data its
//	                           metadata
//
// This is the layout of Apache Curator's InterProcessMutex and of
// go-zookeeper's zk.Lock: dlock, Curator and zk.Lock locks on the path
// LockPath(root, name) exclude each other and queue together. Each lock node
// is created in one transaction with an (empty) write to R/N, whose reply
// carries the transaction's zxid, the new node's czxid: the driver needs
// read, write, create and delete permissions on R/N.
//
// Semaphores and read/write locks have namespaces of their own, which no
// lock name escapes to (Names lists locks only):
//
//	R/%semaphores                           persistent
//	R/%semaphores/N                         container (SemaphorePath)
//	R/%semaphores/N/_c_<guid>-permit-<limit>-<seq>
//	                                        ephemeral-sequential: one per
//	                                        permit or waiter
//	R/%rwlocks                              persistent
//	R/%rwlocks/N                            container (RWLockPath)
//	R/%rwlocks/N/_c_<guid>-__READ__<seq>    ephemeral-sequential: a reader
//	R/%rwlocks/N/_c_<guid>-__WRIT__<seq>    ephemeral-sequential: a writer
//
// A node's data is its lease's metadata. A lock, a semaphore and a
// read/write lock of the same name are three independent objects.
package zookeeper
