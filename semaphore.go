package dlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock/dlock/driver"
)

// MaxLimit bounds a semaphore's number of permits.
const MaxLimit = 1 << 16

// ErrLimitMismatch reports that a permit was asked for under a limit other
// than the one the semaphore's current holders use; nothing was taken. It
// also matches ErrInvalid.
var ErrLimitMismatch = driver.ErrLimitMismatch

// Semaphore hands out at most Limit permits of one name at a time, across
// every process that uses the same name and limit on the same backend. A
// permit is a *Lease with everything a lock's lease has: ValidUntil, the
// refresh watchdog, Done/Err/Context on loss, Release; a crashed holder's
// permit comes back at its TTL. Get one from Locker.Semaphore; it is a
// small value, safe for concurrent use, that holds nothing itself.
//
// Every holder of a name must agree on the limit: an acquisition under
// another limit than the current holders' fails with ErrLimitMismatch
// rather than mixing the two. A semaphore's name is its own namespace: it
// does not conflict with a lock or a read/write lock of the same name.
//
// Waiting and fencing follow the backend's Capabilities (FIFO,
// NotifiedWait, PermitFencing): see the driver's documentation.
type Semaphore struct {
	l     *Locker
	name  string
	limit int
}

// Semaphore returns the semaphore name with limit permits (1 to MaxLimit).
// It fails with ErrInvalid for a bad name or limit, and with an error
// matching errors.ErrUnsupported when the backend has no semaphores; it does
// no I/O.
func (l *Locker) Semaphore(name string, limit int) (*Semaphore, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxLimit {
		return nil, invalid("semaphore limit %d is outside 1 to %d", limit, MaxLimit)
	}
	if !l.caps.Semaphore {
		return nil, unsupported("semaphores")
	}
	return &Semaphore{l: l, name: name, limit: limit}, nil
}

// Name is the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Limit is the semaphore's number of permits.
func (s *Semaphore) Limit() int { return s.limit }

// Acquire waits until it holds a permit or ctx ends, as Locker.Acquire does
// for a lock.
func (s *Semaphore) Acquire(ctx context.Context, opts *Options) (*Lease, error) {
	return s.l.acquire(ctx, object{name: s.name, kind: driver.KindPermit, limit: s.limit}, opts, true)
}

// TryAcquire makes exactly one attempt, as Locker.TryAcquire does: it fails
// with ErrNotAcquired when all permits are held.
func (s *Semaphore) TryAcquire(ctx context.Context, opts *Options) (*Lease, error) {
	ls, err := s.l.acquire(ctx, object{name: s.name, kind: driver.KindPermit, limit: s.limit}, opts, false)
	if busy, ok := err.(*driver.BusyError); ok {
		err = &semaphoreFull{busy: busy, name: s.name, limit: s.limit}
	}
	return ls, err
}

// semaphoreFull is a driver's *BusyError for a semaphore, in a
// semaphore's words; it unwraps to the *BusyError (so matches
// ErrNotAcquired).
type semaphoreFull struct {
	busy  *driver.BusyError
	name  string
	limit int
}

func (e *semaphoreFull) Error() string {
	msg := fmt.Sprintf("%v: all %d permits of semaphore %q are held", ErrNotAcquired, e.limit, e.name)
	if e.busy.RetryAfter > 0 {
		msg += fmt.Sprintf(" (one is free in %v at the latest unless refreshed)", e.busy.RetryAfter)
	}
	return msg
}

func (e *semaphoreFull) Unwrap() error { return e.busy }

// unsupported is the error for a primitive the backend does not offer.
func unsupported(what string) error {
	return fmt.Errorf("%w: dlock: this backend has no %s (see Capabilities)", errors.ErrUnsupported, what)
}
