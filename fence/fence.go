// Package fence keeps a store from taking the writes of a holder whose lease
// has ended: the check a fencing token needs, done by the store, atomically
// with the write.
//
// A lease from a backend that makes fences ([dlock.Lease.Fence]) carries a
// number that strictly increases with every grant of the lock's name. A holder
// paused past its lease (a GC pause, a frozen VM, a partition) may wake
// believing it still holds the lock while another holder has already written;
// only the store can tell the two apart. The protocol:
//
//   - one lock name protects one resource (a row, a key, a file): compare
//     fences of one name only;
//   - every write to the resource carries the writer's fence;
//   - the store keeps the highest fence it has accepted for the resource and
//     refuses a lower one ([ErrStale]), in the same atomic step as the write.
//     An equal fence is accepted: one holder writes as often as it likes.
//
// Guards implement the store's side:
//
//   - [Memory], here, for stores inside one process and for tests;
//   - [github.com/dlock/dlock/fence/pgfence], a guard table and a check that
//     runs inside the caller's PostgreSQL transaction, so that the check and
//     the write commit together;
//   - [github.com/dlock/dlock/fence/redisfence], a script that sets a Redis
//     key only when the fence stored with it is not higher.
//
// A write the guard accepts is still one the lease may have lost just
// before: fencing orders holders, it does not make a lease last longer. What
// it guarantees is that once a newer holder has written, no older holder's
// write lands.
package fence

import (
	"errors"
	"fmt"
	"sync"

	"github.com/dlock/dlock"
)

var (
	// ErrStale is returned, wrapped, by a guard that refused a write: a
	// higher fence has been accepted for the resource, so a newer holder
	// has written and the writer's lease has ended.
	ErrStale = errors.New("fence: stale fencing token, a newer holder has written")

	// ErrNoFence is returned by [Token] for a lease whose backend makes no
	// fencing tokens (or whose Locker was opened with fencing off).
	ErrNoFence = errors.New("fence: the lease has no fencing token")

	// ErrInvalid is returned for an empty resource name, before any I/O.
	ErrInvalid = errors.New("fence: invalid argument")
)

// Token returns the lease's fencing token, or ErrNoFence.
func Token(ls *dlock.Lease) (uint64, error) {
	if ls == nil {
		return 0, fmt.Errorf("%w: nil lease", ErrInvalid)
	}
	f, ok := ls.Fence()
	if !ok {
		return 0, fmt.Errorf("%w (lock %q)", ErrNoFence, ls.Name())
	}
	return f, nil
}

// StaleError describes a refused write; it matches [ErrStale].
type StaleError struct {
	Resource string
	Token    uint64 // the refused fence
	Highest  uint64 // the highest fence accepted for the resource, 0 when the guard does not say
}

func (e *StaleError) Error() string {
	if e.Highest == 0 {
		return fmt.Sprintf("fence: write to %q with fence %d refused: a newer holder has written", e.Resource, e.Token)
	}
	return fmt.Sprintf("fence: write to %q with fence %d refused: fence %d has written", e.Resource, e.Token, e.Highest)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Memory is a guard kept in the process's memory. Its zero value is ready to
// use. Writes to all resources take turns; it is meant for tests and for
// resources that live in one process.
type Memory struct {
	mu      sync.Mutex
	highest map[string]uint64
}

// Write calls write unless a fence higher than token has been accepted for
// resource, and records token as accepted when write returns nil. The check,
// the write and the record happen under one lock, so no other Write for the
// resource runs between them. A refused write returns a *StaleError matching
// ErrStale and does not call write; write's own error is returned as is.
func (m *Memory) Write(resource string, token uint64, write func() error) error {
	if resource == "" {
		return fmt.Errorf("%w: empty resource", ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.highest[resource]; ok && h > token {
		return &StaleError{Resource: resource, Token: token, Highest: h}
	}
	if err := write(); err != nil {
		return err
	}
	if m.highest == nil {
		m.highest = make(map[string]uint64)
	}
	m.highest[resource] = token
	return nil
}

// Highest returns the highest fence accepted for resource, and false when
// none has been.
func (m *Memory) Highest(resource string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.highest[resource]
	return h, ok
}
