package driver

import (
	"context"
	"time"
)

// Recorder is implemented by drivers that keep records on the backend beside
// their locks: one short value per lock name, written only by a holder of
// that name's lock, kept for a retention the writer sets. dlock.Once stores
// the completion of a schedule slot's run this way, so that no host runs the
// slot again. Drivers that implement it declare Capabilities.Records.
//
// A record lives in a namespace of its own (never among the lock's own keys,
// nodes or rows): it outlives the lock, the lease, the Locker and, where the
// backend persists its data, a restart of the server.
type Recorder interface {
	// Record writes value as the record of h's lock name, replacing any
	// earlier one, to be kept for ttl (> 0) from the write, only if h (a
	// Handle of this driver, of a KindLock grant) still holds its lock:
	// the check and the write are one step on the server where it can do
	// that (a script, a transaction, a multi-op), so that a holder whose
	// lock was lost or taken over writes nothing. It returns an error
	// matching ErrNotHeld when the lock was not h's, and nothing was
	// written. ctx bounds the call; an error other than ErrNotHeld leaves
	// it unknown whether the record was written.
	Record(ctx context.Context, h Handle, value string, ttl time.Duration) error

	// Recorded reads the record of name: its value and true, or false
	// when there is none (never written, or kept past its ttl). A read
	// made after the reader was granted name's lock sees every record
	// written by an earlier holder. ctx bounds the call.
	Recorded(ctx context.Context, name string) (value string, ok bool, err error)
}
