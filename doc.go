// Package dlock is one distributed-lock API over Redis, Redlock (several
// independent Redis masters), etcd, ZooKeeper and PostgreSQL, chosen by a URL.
//
// # Open a Locker
//
// Link the driver in with a blank import and [Open] a URL:
//
//	import _ "github.com/dlock/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
//	if err != nil { … }
//	defer locker.Close(ctx) // releases whatever is still held
//
// Or build one on a client the application already has, with the driver's
// New: redis.New(client, opts), etcd.New(client, opts), zookeeper.New(conn,
// opts), postgres.New(pool, opts), redlock.New(clients, opts). A [Locker] is
// safe for concurrent use; one per process and backend is the usual shape.
//
// # Take a lock
//
//	lease, err := locker.Acquire(ctx, "nightly-report", nil) // waits; TryAcquire tries once
//	if err != nil { … }        // errors.Is(err, dlock.ErrNotAcquired) when ctx ended first
//	defer lease.Release(ctx)   // removes only this lease's lock
//
// [Locker.Acquire] waits until the lock is granted or ctx ends;
// [Locker.TryAcquire] makes one attempt and returns an error matching
// [ErrNotAcquired] when someone else holds the lock. [Options] (nil for the
// Locker's defaults) set the TTL, the refresh watchdog and the retry delays
// of drivers that poll.
//
// # Fence what you protect
//
// A lease is exclusive while it is valid, until [Lease.ValidUntil]. No lock
// with a TTL can stop a holder that pauses (GC, SIGSTOP, a VM migration) past
// its ValidUntil from waking up and writing: pass [Lease.Fence] with every
// write, and let the storage refuse a token lower than the highest it has
// seen. [Locker.Capabilities] says whether the backend makes tokens
// (Fencing).
//
// # Hear about loss
//
// The watchdog refreshes the lock every TTL/3. When the lock is lost —
// expired, taken over, its session or connection gone, or not refreshed
// before ValidUntil — the lease says so: [Lease.Done] is closed, [Lease.Err]
// matches [ErrLost] and [Lease.Context] is cancelled. Run the work under
// lease.Context(). Loss is always reported this way, never only logged.
//
// # Tie the lease to the work
//
// A watchdog keeps a lease as long as the process lives, even when the work
// that took it is hung. Two options bound that; past them the watchdog stops
// refreshing, and the lease ends at its ValidUntil with an error matching
// [ErrLost] that says why:
//
//   - [Options.MaxHold]: no refresh after it; the lease ends at most
//     MaxHold + TTL after the grant ([ErrMaxHold]).
//   - [Options.HeartbeatTimeout]: the watchdog refreshes only while the work
//     calls [Lease.Heartbeat] within it; the lease ends at most
//     HeartbeatTimeout + TTL after the last call ([ErrHeartbeatTimeout]).
//
// Heartbeat is an atomic store of a clock reading, cheap enough for the
// work's inner loop:
//
//	lease, err := locker.Acquire(ctx, "reindex", &dlock.Options{HeartbeatTimeout: 30 * time.Second})
//	for batch := range batches {
//		lease.Heartbeat()
//		if err := reindex(lease.Context(), batch); err != nil { … }
//	}
//
// dlock run has them as -max-hold and -heartbeat.
//
// # Do
//
// [Do] wraps the whole pattern: acquire, run fn with the lease and a context
// that ends if the lease is lost, release:
//
//	err := dlock.Do(ctx, locker, "migrate", nil, func(ctx context.Context, lease *dlock.Lease) error {
//		fence, _ := lease.Fence()
//		return migrate(ctx, fence)
//	})
//
// # Several names, all or nothing
//
// [Locker.AcquireAll] returns one lease holding every name, or none of them:
//
//	lease, err := locker.AcquireAll(ctx, []string{"account/7", "account/9"}, nil)
//	fences, _ := lease.Fences() // one per name, in the order of lease.Names()
//
// It takes the names in sorted order, so two AcquireAll calls never
// deadlock on each other; the lease is refreshed, released and lost as a
// whole (a lost name is named in the error, the others are given back).
// [Locker.TryAcquireAll] fails at the first busy name and keeps nothing.
//
// # Semaphores, read/write locks, leader election
//
// The same leases, for other shapes of exclusion ([Locker.Semaphore],
// [Locker.RWLock], [Locker.Elect]), on every backend whose [Capabilities]
// declare them (Semaphore, RWLock; elections need Metadata and Fencing); an
// unsupported one fails at creation with [errors.ErrUnsupported]:
//
//	sem, err := locker.Semaphore("encoders", 3)   // at most 3 permits at once
//	permit, err := sem.Acquire(ctx, nil)         // a *Lease: Done, Fence, Release…
//
//	rw, err := locker.RWLock("catalog")
//	r, err := rw.RLock(ctx, nil)                 // readers share; Lock is alone
//
//	lead, err := locker.Elect(ctx, "controller", hostname, nil) // returns when this one leads
//	run(lead.Context())                           // ends when leadership is lost
//	who, err := locker.Leader(ctx, "controller") // who leads, and the term (its fence)
//
// Semaphore holders must agree on the limit ([ErrLimitMismatch] otherwise). A
// waiting writer keeps new readers out. An election is the lock of that name,
// its leader's candidate id stored as the lock's metadata; the term is the
// fence, which strictly increases from leader to leader.
//
// # Once per schedule slot
//
// A job that cron starts on several hosts runs once per slot with
// [Locker.Once], on backends that keep records (Records): the slot's
// completion is recorded on the backend, fenced by the lease, and later
// tries of the slot, on any host, return [ErrAlreadyDone]:
//
//	slot := dlock.Slot(time.Now(), time.Hour) // "2026-11-28T03:00:00Z": hosts agree
//	err := locker.Once(ctx, "hourly-report", slot, nil, report)
//
// # Errors
//
// Match with [errors.Is]: [ErrNotAcquired] (busy, or the wait ended),
// [ErrNotHeld] ([ErrLost], [ErrReleased]; a loss at [ErrMaxHold] or
// [ErrHeartbeatTimeout] matches both), [ErrClosed], [ErrInvalid] (bad
// input, reported before any I/O), [ErrGrantExpired] (granted, but the reply
// came too late for the TTL: not busy), [ErrLimitMismatch] (a semaphore asked
// for under another limit than its holders'), [ErrAlreadyDone] and
// [ErrAttemptsExhausted] (Once). Credentials from URLs never
// appear in errors.
//
// # Choosing a backend
//
//   - redis: the fastest; one node decides, so a failover to an
//     asynchronously replicated replica can lose a lock (use the fence).
//   - redlock: several independent Redis masters, no single point of
//     failure, under Redlock's timing assumptions.
//   - etcd: quorum-replicated locks that survive a member failure; FIFO.
//   - zookeeper: ephemeral nodes, FIFO, losses reported as soon as a session
//     expires.
//   - postgres: advisory locks on the database you protect; FIFO, visible
//     and breakable from psql.
//   - memory (mem://): tests of code that uses locks, in one process.
//
// Each driver's package doc states its URL, guarantees and layout, and links
// the driver's design document (DESIGN.md beside its code). Driver authors
// start at package [github.com/dlock/dlock/driver] and prove their driver
// with package [github.com/dlock/dlock/conformance].
package dlock
