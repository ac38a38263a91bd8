package bench

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

// Peer is another library's lock on a backend: what a user would pick
// instead of dlock. `dlock bench -peers` measures each peer in the same run
// and the same scenarios as the driver and the floor, taking turns with
// them, so that the three can be read side by side.
//
// A peer is opened as a floor is: one independent client per worker, used
// by one goroutine at a time, behind the Floor interface. TryLock is the
// library's single attempt (the uncontended scenario, the handoff's holder).
// A peer whose library waits by itself also implements Waiter, and that
// wait is what the handoff's waiter and the contended workers use; a peer
// without it waits by spinning TryLock, as the floor does.
type Peer struct {
	// Name is the library's lock as the report names it ("redsync").
	Name string
	// Module is the Go module the library comes from, whose version the
	// report shows when this binary has it.
	Module string
	// About says how the peer is set up, for the report's notes.
	About string
	// Open opens one independent client.
	Open FloorOpener
}

// Waiter is a Floor whose library waits for a lock by itself: its retry
// loop, a server-side queue or a watch.
type Waiter interface {
	// Lock waits until name is held for token, expiring after ttl where the
	// library has expiry, or until ctx ends: then it returns an error, and a
	// lock the library was granted at that moment may stay until its TTL
	// runs out or is given back in the background.
	Lock(ctx context.Context, name, token string, ttl time.Duration) error
}

// PeerRetryDelay is the delay between the attempts of the peers that wait by
// polling (redsync, redislock): dlock's own first retry delay
// (dlock.DefaultRetryMin), fixed, so that no peer waits longer than it must.
// redsync's own default is a random 50–250ms; redislock has none (it does
// not retry unless told to).
const PeerRetryDelay = dlock.DefaultRetryMin

// moduleVersion is the version of module path in this binary, "" when it is
// not there.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || path == "" {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}

// detached runs the waits of a library that cannot cut a wait short (or
// only at a cost that would weigh on the measurement) in goroutines of its
// own, so that a wait ends when its ctx does. A wait left behind goes on in
// the background and gives its lock back as soon as it is granted: the
// bench ends waits only at the end of a round, when every holder releases.
type detached struct {
	wg      sync.WaitGroup
	pending []chan struct{} // closed when a wait left behind has ended
}

// wait runs lock in a goroutine and returns its error; when ctx ends first,
// it returns at once with dlock.ErrNotAcquired and ctx's error, and the
// goroutine calls unlock if lock succeeds later.
func (d *detached) wait(ctx context.Context, lock func() error, unlock func()) error {
	result := make(chan error) // unbuffered: taken only while wait listens
	abandoned := make(chan struct{})
	done := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(done)
		err := lock()
		select {
		case result <- err:
		case <-abandoned:
			if err == nil {
				unlock()
			}
		}
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		close(abandoned)
		d.pending = append(d.pending, done)
		return errors.Join(dlock.ErrNotAcquired, ctx.Err())
	}
}

// idle waits until no wait left behind is running: for a client that
// cannot run two calls at once.
func (d *detached) idle() {
	for _, p := range d.pending {
		<-p
	}
	d.pending = nil
}

// close waits for every goroutine; the caller has first made the waits
// return (closed the connection).
func (d *detached) close() { d.wg.Wait(); d.pending = nil }
