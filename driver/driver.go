package driver

import (
	"context"
	"time"
)

// Driver is what a backend implements: the primitives of one lock service.
// Everything that is the same for every backend — validation, waiting,
// validity deadlines, the refresh watchdog, loss signalling, bookkeeping for
// Close — is done once by the Locker that New builds around a Driver.
//
// A Driver's methods are called concurrently. Names and requests it is given
// have been validated already.
type Driver interface {
	// Capabilities describes the backend; it must not change.
	Capabilities() Capabilities

	// TryAcquire makes exactly one attempt to take req.Name for req.Token.
	// When someone else holds it, it returns an error matching
	// ErrNotAcquired, preferably a *BusyError carrying the holder's remaining
	// time. ctx bounds the attempt.
	TryAcquire(ctx context.Context, req Request) (*Grant, error)

	// Close releases the driver's own resources (not the application's
	// client, when the driver was built from one). The Locker has already
	// released every lease and stopped all its goroutines.
	Close() error
}

// Pinger is implemented by drivers that connect to their server when opened
// from a URL. dlock.Open calls Ping, bounded by its ctx, after it has
// validated the URL's lock options, and closes the driver when Ping fails.
// The error must not contain the URL's password.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Waiter is implemented by drivers whose backend queues waiters itself (etcd
// and ZooKeeper queues, PostgreSQL's lock queue). Acquire blocks until the lock
// is granted or ctx ends; on return without a grant it must leave no waiter
// state behind on the server. The Locker calls it for every kind the driver
// declares, so it waits for permits and read/write locks too (the Locker's
// polling, and with it WatchWait, is never used for a Waiter).
type Waiter interface {
	Acquire(ctx context.Context, req Request) (*Grant, error)
}

// Notifier is implemented by drivers that can tell a waiter when a name may
// have become free (for example by a message published on release). Watch
// is for KindLock only: a Locker waiting for another kind, on a driver that
// is neither a Waiter nor a WaitNotifier, polls with backoff. A Waiter's
// Watch serves Locker.Observe only (its waits never watch), and may hear
// only some releases (those of leases with metadata, which elections
// have); Observe looks again at the holder's TTL or RetryMax anyway. Watch
// returns once the subscription is in place, so that a release after Watch
// returns is never missed. The channel receives (or is closed) when the
// name may be free; stop ends the watch.
type Notifier interface {
	Watch(ctx context.Context, name string) (c <-chan struct{}, stop func(), err error)
}

// WaitNotifier is implemented by Notifiers whose TryAcquire, in an attempt
// that finds the lock busy, can already queue the waiter behind a watch, so
// that the Locker need not make another attempt after watching. The Locker
// then gives every attempt of a waiting Acquire the same Request.Wait, and
// calls WatchWait instead of Watch once an attempt of that wait found the
// lock busy, and EndWait once when the wait ends (granted or not), after its
// last attempt returned.
type WaitNotifier interface {
	Notifier
	// WatchWait returns the wait's watch, as Watch does, for req.Kind's
	// object of req.Name. queued reports
	// that an attempt of this wait has already queued it behind this watch,
	// so that no release after that attempt goes unheard: the Locker waits
	// without looking again first. The watch ends with EndWait.
	WatchWait(ctx context.Context, req Request) (c <-chan struct{}, queued bool, err error)
	// EndWait stops the watch of req.Wait, and whatever its attempts left
	// on the server for it, if anything.
	EndWait(req Request)
}

// Abandoner is implemented by drivers whose TryAcquire can take the lock and
// still return an error: the reply was lost, or ctx ended with the request
// already sent. The Locker then calls Abandon, in the background and bounded
// by the TTL, to remove the lock if req.Token holds it, so that a cancelled
// acquisition does not leave a lock that nobody holds until it expires.
// Every attempt of a wait uses a token of its own, so an abandon never
// removes a later attempt's grant. The Locker also calls Abandon with the
// request of a lease that ends at its ValidUntil unrefreshed, so that a
// refresh still on its way cannot keep what was declared lost.
type Abandoner interface {
	Abandon(ctx context.Context, req Request) error
}

// Stealer is implemented by drivers that can take a held lock over, for
// Locker.Steal (operators breaking a stuck lock). Steal makes req.Token the
// holder of req.Name's lock (KindLock) at once, whoever held it, or if
// nobody did, with a fence above every earlier grant of the name when the
// driver declares Fencing; waiters queued for the name keep their places.
// The previous holder's later Refresh, Release and Held find the lock not
// theirs (ErrNotHeld, wrapping ErrTakenOver where the driver can tell);
// with Capabilities.StealNotified the backend tells it sooner, through its
// handle's LossNotifier. A Steal that fails after its request was sent is
// abandoned as a failed TryAcquire is (see Abandoner).
type Stealer interface {
	Steal(ctx context.Context, req Request) (*Grant, error)
}

// MultiAcquirer is implemented by drivers that can try several locks in one
// request: Locker.TryAcquireAll, and the first attempt of AcquireAll, use
// it instead of one attempt per name. TryAcquireAll makes one attempt at
// every reqs[i] (KindLock, no Metadata, distinct names in sorted order,
// each with its own Token and the same TTL) and returns a grant for each,
// in order, when all were free; when any is held it takes none and returns
// an error matching ErrNotAcquired (a *BusyError for the first busy name,
// preferably). An error wrapping errors.ErrUnsupported, before any I/O,
// sends the Locker to the one-by-one path (a Cluster client whose names
// span slots, say). A request that fails after it was sent is abandoned
// name by name (Abandoner).
type MultiAcquirer interface {
	TryAcquireAll(ctx context.Context, reqs []Request) ([]*Grant, error)
}

// Request is one acquisition attempt.
type Request struct {
	Name     string
	Token    string        // random, 128 bits, hex: unique to this lease
	TTL      time.Duration // how long the server keeps the lock unless refreshed
	Metadata string
	// Wait is the same in every attempt of one waiting Acquire that polls
	// (a driver without Waiter) and unique to it (random hex); empty in
	// TryAcquire. A WaitNotifier keys its watch on it; a KindWrite attempt
	// registers its writer's wait under it (see KindWrite).
	Wait string
	// Kind is what is asked for: a lock (the zero value), a permit, or a
	// side of a read/write lock. Only kinds the driver's Capabilities
	// declare are sent.
	Kind Kind
	// Limit is the semaphore's number of permits, for KindPermit (≥ 1);
	// zero for the other kinds.
	Limit int
}

// Grant is what a driver returns for a granted lock.
type Grant struct {
	// Handle performs the lease's later operations.
	Handle Handle
	// Fence is the fencing token, when the driver declares Fencing.
	Fence uint64
	// TTL is the lifetime the server granted, when it differs from the one
	// requested (etcd raises short TTLs, ZooKeeper negotiates its session
	// timeout). Zero means as requested.
	TTL time.Duration
	// Sent, when not zero, is when the request that started the granted
	// TTL was sent: for a driver that waits (Waiter), or is granted through a
	// queue, the last request before the grant, not the start of the wait.
	// Zero means when the Locker called the driver.
	Sent time.Time
	// Drift, when not zero, replaces the default clock drift margin
	// (TTL/100 + 2ms) subtracted from the lease's validity.
	Drift time.Duration
}

// LossNotifier is implemented by Handles that learn that their lock is gone
// (session expired, connection lost, key deleted) before a refresh would
// find out; the Locker turns the call into the lease's loss signal, without
// a goroutine per lease. A Handle without it is found lost by its next
// refresh, or at its ValidUntil.
type LossNotifier interface {
	// OnLost registers f, called once when the driver learns that the lock
	// is gone, at once if that has happened already. The Locker calls
	// OnLost once, right after the grant, holding none of its locks; f
	// does not block and calls nothing of the driver's.
	OnLost(f func())
}

// LossCauser is implemented by LossNotifier handles that can say why their
// lock is gone: when OnLost's f is called, the Locker asks LossCause, and
// the lease's Err wraps ErrLost and the error returned (one wrapping
// ErrTakenOver for a lock stolen, say). nil: the backend reported it gone,
// without a reason.
type LossCauser interface {
	LossCause() error
}

// BatchRefresher is implemented by drivers that can refresh many leases in
// one request (one script over many keys, one statement over many rows).
// The Locker then gathers its leases' watchdog refreshes that fall due
// within a short window (a tenth of their refresh interval, at most 50ms,
// early rather than late) and sends them together: with thousands of
// leases, a few requests per interval instead of one per lease.
type BatchRefresher interface {
	// RefreshBatch refreshes each hs[i], one of this driver's Handles, to
	// ttls[i] from now, as hs[i].Refresh would, and returns per handle what
	// that would have: the TTL granted (zero: as asked) and the error
	// (ErrNotHeld for a lock that is no longer the handle's). A request
	// that fails as a whole fails every handle's refresh with its error.
	// Both slices have len(hs) entries.
	RefreshBatch(ctx context.Context, hs []Handle, ttls []time.Duration) (granted []time.Duration, errs []error)
}

// Handle is the driver's side of one held lease.
type Handle interface {
	// Refresh extends the lock to ttl from now and returns the TTL granted
	// (zero: as asked). It fails with an error matching ErrNotHeld when the
	// lock is no longer this lease's, and must never re-create a lost lock.
	Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error)
	// Release removes the lock only if it is still this lease's. It returns
	// an error matching ErrNotHeld when it was not (already gone or taken
	// over), and nil when it removed it.
	Release(ctx context.Context) error
	// Held asks the server whether the lock is still this lease's.
	Held(ctx context.Context) (bool, error)
}
