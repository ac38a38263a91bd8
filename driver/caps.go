package driver

import "time"

// Capabilities is what a driver declares about its backend. The conformance
// suite skips a property whose capability is missing (naming it), and
// `dlock bench` reports them.
type Capabilities struct {
	// Fencing: every grant carries a fencing token that strictly increases
	// with every grant of the same name, across holders and takeovers.
	Fencing bool
	// FIFO: blocked waiters are granted in arrival order.
	FIFO bool
	// NotifiedWait: a blocked waiter is woken by the backend when the lock is
	// released, rather than by polling.
	NotifiedWait bool
	// MinTTL is the shortest TTL the backend can honour; shorter ones are
	// rejected with ErrInvalid.
	MinTTL time.Duration
	// SurvivesRestart: a held lock survives a restart of the server.
	SurvivesRestart bool
	// ExpirySlack is how long after a holder's ValidUntil the backend may still
	// keep its lock from others (for example a session timeout rounded up by
	// the server). Zero for a backend that expires at the TTL.
	ExpirySlack time.Duration
	// ConnectionBound: a lock lives only as long as the holder's connection
	// to the server (PostgreSQL session advisory locks). A connection that
	// resets frees the lock at once, possibly before the holder's ValidUntil;
	// the lease reports the loss as soon as the driver sees the connection
	// fail. Lease.Fence, where available, protects the resource meanwhile.
	ConnectionBound bool

	// Metadata: the backend stores a lock's Request.Metadata while it is
	// held, and the driver's Inspect reports it (LockInfo.Metadata). Leader
	// election (Locker.Elect) needs it, with Fencing and Inspector, to name
	// the leader.
	Metadata bool

	// Semaphore: the driver grants KindPermit requests (Locker.Semaphore).
	Semaphore bool
	// PermitFencing: every permit grant carries a fencing token that
	// strictly increases with every grant of the same semaphore. Fencing
	// alone covers locks and the write side of read/write locks.
	PermitFencing bool
	// Steal: the driver takes held locks over (Stealer, Locker.Steal).
	Steal bool
	// StealNotified: the previous holder of a stolen lock hears of it
	// from the backend (a watch, a notification) as soon as the steal
	// happens; without it, at its next refresh.
	StealNotified bool

	// RWLock: the driver grants KindRead and KindWrite requests
	// (Locker.RWLock). Fencing, when declared, covers the write side: a
	// writer's token strictly increases with every write grant of the name.
	RWLock bool

	// Records: the driver keeps records beside its locks, written only
	// by a holder of the lock (Recorder; dlock.Once).
	Records bool
	// DurableRecords: records survive a crash and restart of the server
	// (etcd, ZooKeeper, PostgreSQL; Redis only as its persistence is
	// configured, so its driver does not declare it).
	DurableRecords bool
}

// Fences reports whether grants of kind k carry fencing tokens: Fencing for
// locks and writers, PermitFencing for permits, never for readers (they
// hold together, so there is no order to fence).
func (c Capabilities) Fences(k Kind) bool {
	switch k {
	case KindLock, KindWrite:
		return c.Fencing
	case KindPermit:
		return c.PermitFencing
	}
	return false
}

// Supports reports whether the driver grants requests of kind k.
func (c Capabilities) Supports(k Kind) bool {
	switch k {
	case KindLock:
		return true
	case KindPermit:
		return c.Semaphore
	case KindRead, KindWrite:
		return c.RWLock
	}
	return false
}
