package driver

import (
	"errors"
	"fmt"
	"time"
)

// The errors of the dlock contract, the same values as dlock's (dlock.ErrInvalid
// is ErrInvalid, and so on). A driver wraps them with %w, keeping the backend's
// own error in the chain; applications match them with errors.Is.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or a wait
	// ended before the lock was granted. Return a *BusyError (Busy) for the
	// first when the holder's remaining time is known.
	ErrNotAcquired = errors.New("dlock: lock not acquired")

	// ErrNotHeld: the lease does not hold its lock (any more): what Refresh
	// and Release return when the lock is gone or someone else's.
	ErrNotHeld = errors.New("dlock: lock not held")

	// ErrLost: the lease ended without its holder releasing it. Matches
	// ErrNotHeld.
	ErrLost error = &notHeldError{"dlock: lease lost"}

	// ErrReleased: the lease was released by its holder. Matches ErrNotHeld.
	ErrReleased error = &notHeldError{"dlock: lease released"}

	// ErrTakenOver: the lock is held by another owner who took it over
	// (Locker.Steal), or took it after it expired. Matches ErrNotHeld; a
	// driver wraps it in the ErrNotHeld of a Refresh, Release or Held that
	// finds another owner's token, where it can tell that from a lock
	// that is simply gone.
	ErrTakenOver error = &notHeldError{"dlock: lock taken over by another owner"}

	// ErrClosed: the Locker was closed.
	ErrClosed = errors.New("dlock: locker closed")

	// ErrInvalid: bad input, reported before any I/O.
	ErrInvalid = errors.New("dlock: invalid argument")

	// ErrResourceLimit: an acquisition needs a client-side resource that is
	// used up (such as every connection of a pool holding a lease); the
	// error names the limit and how to raise it. It also matches
	// ErrNotAcquired: nothing was taken.
	ErrResourceLimit error = &limitReached{"dlock: resource limit reached"}
)

type limitReached struct{ msg string }

func (e *limitReached) Error() string        { return e.msg }
func (e *limitReached) Is(target error) bool { return target == ErrNotAcquired }

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
