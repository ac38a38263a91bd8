package dlock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dlock/dlock/driver"
)

// Errors. Match them with errors.Is: drivers wrap them with %w and keep the
// backend's own error in the chain.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or a wait
	// ended before the lock was granted (Acquire; the error then also matches
	// the context's error).
	ErrNotAcquired = driver.ErrNotAcquired

	// ErrGrantExpired: the backend granted the lock, but by the time its reply
	// arrived the grant's validity (the TTL minus the drift margin, counted
	// from when the request was sent) had passed, so the lock was given back
	// at once. The round trip took longer than the TTL allows: the TTL is too
	// short for this backend or the process was stalled. It does not match
	// ErrNotAcquired: it says nothing about another holder. TryAcquire
	// returns it; Acquire tries again (after RetryMin, doubling up to
	// RetryMax) until ctx ends, and its error then matches ErrNotAcquired,
	// ctx.Err() and ErrGrantExpired.
	ErrGrantExpired = errors.New("dlock: grant expired before it arrived")

	// ErrNotHeld: the lease does not hold its lock (any more). ErrLost and
	// ErrReleased both match it.
	ErrNotHeld = driver.ErrNotHeld

	// ErrLost: the lease ended without its holder releasing it: it expired,
	// was taken over, its key, node, session or connection is gone, or it could
	// not be refreshed before its ValidUntil. Matches ErrNotHeld.
	ErrLost = driver.ErrLost

	// ErrTakenOver: another owner holds the lock now: it was stolen
	// (Locker.Steal) or taken after it expired. A lease that ended so has an
	// Err matching ErrLost, and ErrTakenOver where the driver can tell.
	ErrTakenOver = driver.ErrTakenOver

	// ErrReleased: the lease was released by its holder. Matches ErrNotHeld.
	ErrReleased = driver.ErrReleased

	// ErrMaxHold: the lease was held for its Options.MaxHold, so the
	// watchdog stopped refreshing it. A lease that ended so has an Err
	// matching both ErrLost and ErrMaxHold; a Refresh refused past MaxHold
	// matches ErrMaxHold alone (the lease stays valid until ValidUntil).
	ErrMaxHold = errors.New("dlock: lease held for its MaxHold")

	// ErrHeartbeatTimeout: the work holding a lease with
	// Options.HeartbeatTimeout did not call Lease.Heartbeat within it, so
	// the watchdog stopped refreshing the lease. A lease that ended so has an
	// Err matching both ErrLost and ErrHeartbeatTimeout.
	ErrHeartbeatTimeout = errors.New("dlock: no heartbeat from the lease's work within its HeartbeatTimeout")

	// ErrClosed: the Locker was closed.
	ErrClosed = driver.ErrClosed

	// ErrInvalid: bad input, reported before any I/O.
	ErrInvalid = driver.ErrInvalid

	// ErrResourceLimit: the acquisition needs a client-side resource that
	// is used up (the postgres driver: every connection of its pool holds
	// a lease or a wait); the error names the limit. It matches
	// ErrNotAcquired, and is returned within about a second of the limit
	// being reached rather than waiting for a release (the postgres
	// driver's pool gives no non-blocking acquire: it watches its own wait).
	ErrResourceLimit = driver.ErrResourceLimit
)

// invalid returns an error matching ErrInvalid.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// joinLine is errors.Join on one line, for the errors of an acquisition
// (ErrNotAcquired, the ctx's error, the last attempt's): Error is the first
// error's message, ": ", then the others' separated by "; " (each without
// the first's message as its own prefix), and errors.Is and errors.As see
// every one. Joined errors (joinLine's and errors.Join's) are flattened, a
// repeated error is kept once and nils are dropped; a single error is
// returned as it is.
func joinLine(errs ...error) error {
	var flat []error
	var add func(err error)
	add = func(err error) {
		if err == nil {
			return
		}
		if parts := joined(err); parts != nil {
			for _, p := range parts {
				add(p)
			}
			return
		}
		for _, k := range flat {
			if k.Error() == err.Error() && errors.Is(err, k) {
				return
			}
		}
		flat = append(flat, err)
	}
	for _, err := range errs {
		add(err)
	}
	switch len(flat) {
	case 0:
		return nil
	case 1:
		return flat[0]
	}
	return &lineError{flat}
}

// joined returns the errors err joins, if it is a joinLine or errors.Join
// error (whose message is its errors' messages, one per line), else nil.
func joined(err error) []error {
	if e, ok := err.(*lineError); ok {
		return e.errs
	}
	m, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return nil
	}
	parts := m.Unwrap()
	msgs := make([]string, 0, len(parts))
	for _, p := range parts {
		if p != nil {
			msgs = append(msgs, p.Error())
		}
	}
	if err.Error() != strings.Join(msgs, "\n") {
		return nil // its own message says more than its parts: keep it whole
	}
	return parts
}

type lineError struct{ errs []error }

func (e *lineError) Error() string {
	first := e.errs[0].Error()
	rest := make([]string, 0, len(e.errs)-1)
	for _, err := range e.errs[1:] {
		rest = append(rest, strings.TrimPrefix(err.Error(), first+": "))
	}
	return first + ": " + strings.Join(rest, "; ")
}

func (e *lineError) Unwrap() []error { return e.errs }
