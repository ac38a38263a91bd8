package driver

import (
	"errors"
	"fmt"
)

// Kind is what a Request asks for. The zero value is an exclusive lock, so a
// driver that knows nothing of the other kinds sees only KindLock: the
// Locker sends the others only to a driver whose Capabilities declare them.
//
// Each kind has a namespace of its own on the server: a lock, a semaphore
// and a read/write lock of the same name are three independent objects
// (KindRead and KindWrite are the two sides of one read/write lock).
type Kind uint8

const (
	// KindLock: an exclusive lock.
	KindLock Kind = iota
	// KindPermit: one of Request.Limit permits of a semaphore. At most Limit
	// permits of a name are held at any time; a holder's permit comes back
	// at its TTL like a lock. Every holder of a name must ask with the same
	// Limit: TryAcquire (and Waiter.Acquire) return an error matching
	// ErrLimitMismatch when a permit of the name is held under another
	// limit.
	KindPermit
	// KindRead: the shared side of a read/write lock. Any number of readers
	// hold it together while no writer does.
	KindRead
	// KindWrite: the exclusive side of a read/write lock: no reader and no
	// other writer hold it meanwhile. A writer that waits keeps new readers
	// out (writers are not starved by a stream of readers): a KindRead
	// attempt fails as busy while a write wait is registered, from the
	// writer's first attempt that found the lock busy until its wait ends
	// (granted, or EndWait, or for a Waiter its Acquire's return).
	KindWrite
)

// String names the kind as the docs do: "lock", "permit", "read", "write".
func (k Kind) String() string {
	switch k {
	case KindLock:
		return "lock"
	case KindPermit:
		return "permit"
	case KindRead:
		return "read"
	case KindWrite:
		return "write"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ErrLimitMismatch reports that a permit was asked for under a limit other
// than the one its semaphore's current holders use. Nothing was taken.
var ErrLimitMismatch = errors.New("dlock: semaphore limit differs from its holders'")

// LimitMismatch returns an error matching ErrLimitMismatch and ErrInvalid
// that names both limits (held: 0 when the backend cannot tell it).
func LimitMismatch(name string, asked, held int) error {
	if held > 0 {
		return &limitError{fmt.Sprintf("%v: %q is held with limit %d, asked with %d", ErrLimitMismatch, name, held, asked)}
	}
	return &limitError{fmt.Sprintf("%v: %q is held with a limit other than %d", ErrLimitMismatch, name, asked)}
}

type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }
func (e *limitError) Is(target error) bool {
	return target == ErrLimitMismatch || target == ErrInvalid
}
