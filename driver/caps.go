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
}
