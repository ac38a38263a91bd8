package dlock

import (
	"context"

	"github.com/dlock/dlock/driver"
)

// RWLock is a read/write lock: any number of readers hold it together while
// no writer does, and a writer holds it alone. Readers and writers get a
// *Lease each, with everything a lock's lease has. Get one from
// Locker.RWLock; it is a small value, safe for concurrent use, that holds
// nothing itself.
//
// Writers are not starved: once a writer waits (Lock found the lock busy),
// new readers wait too — RLock blocks and TryRLock fails — until that writer
// has held and released it or given up. Readers already holding keep it.
// With Fencing, writers' leases carry fencing tokens that strictly increase
// with every write grant; readers' leases have none.
//
// A read/write lock's name is its own namespace: it does not conflict with
// a lock or a semaphore of the same name.
type RWLock struct {
	l    *Locker
	name string
}

// RWLock returns the read/write lock name. It fails with ErrInvalid for a
// bad name and with an error matching errors.ErrUnsupported when the backend
// has no read/write locks; it does no I/O.
func (l *Locker) RWLock(name string) (*RWLock, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if !l.caps.RWLock {
		return nil, unsupported("read/write locks")
	}
	return &RWLock{l: l, name: name}, nil
}

// Name is the lock's name.
func (rw *RWLock) Name() string { return rw.name }

// Lock waits until it holds the lock alone (the write side) or ctx ends.
func (rw *RWLock) Lock(ctx context.Context, opts *Options) (*Lease, error) {
	return rw.l.acquire(ctx, object{name: rw.name, kind: driver.KindWrite}, opts, true)
}

// TryLock makes exactly one attempt at the write side.
func (rw *RWLock) TryLock(ctx context.Context, opts *Options) (*Lease, error) {
	return rw.l.acquire(ctx, object{name: rw.name, kind: driver.KindWrite}, opts, false)
}

// RLock waits until it holds the read side or ctx ends.
func (rw *RWLock) RLock(ctx context.Context, opts *Options) (*Lease, error) {
	return rw.l.acquire(ctx, object{name: rw.name, kind: driver.KindRead}, opts, true)
}

// TryRLock makes exactly one attempt at the read side: it fails with
// ErrNotAcquired while a writer holds the lock or waits for it.
func (rw *RWLock) TryRLock(ctx context.Context, opts *Options) (*Lease, error) {
	return rw.l.acquire(ctx, object{name: rw.name, kind: driver.KindRead}, opts, false)
}
