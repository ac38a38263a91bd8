package dlock

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is: drivers wrap them with %w and keep
// the backend's own error in the chain.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or a wait
	// ended before the lock was granted (Acquire; the error then also matches
	// the context's error).
	ErrNotAcquired = errors.New("dlock: lock not acquired")

	// ErrNotHeld: the lease does not hold its lock (any more). ErrLost and
	// ErrReleased both match it.
	ErrNotHeld = errors.New("dlock: lock not held")

	// ErrLost: the lease ended without its holder releasing it: it expired,
	// was taken over, its key, node, session or connection is gone, or it could
	// not be refreshed before its ValidUntil. Matches ErrNotHeld.
	ErrLost error = &notHeldError{"dlock: lease lost"}

	// ErrReleased: the lease was released by its holder. Matches ErrNotHeld.
	ErrReleased error = &notHeldError{"dlock: lease released"}

	// ErrClosed: the Locker was closed.
	ErrClosed = errors.New("dlock: locker closed")

	// ErrInvalid: bad input, reported before any I/O.
	ErrInvalid = errors.New("dlock: invalid argument")
)

type notHeldError struct{ msg string }

func (e *notHeldError) Error() string        { return e.msg }
func (e *notHeldError) Is(target error) bool { return target == ErrNotHeld }

// BusyError is what a driver's TryAcquire returns when someone else holds the
// lock. It matches ErrNotAcquired. RetryAfter, when known, is how long the
// current holder's lock has left: a waiter without a better signal polls no
// sooner than that.
type BusyError struct {
	RetryAfter time.Duration
}

// Busy returns a *BusyError with the given hint (0 when unknown).
func Busy(retryAfter time.Duration) error { return &BusyError{RetryAfter: retryAfter} }

func (e *BusyError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v: held by another owner (expires in %v at the latest unless refreshed)", ErrNotAcquired, e.RetryAfter)
	}
	return fmt.Sprintf("%v: held by another owner", ErrNotAcquired)
}

func (e *BusyError) Is(target error) bool { return target == ErrNotAcquired }

// invalid returns an error matching ErrInvalid.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
