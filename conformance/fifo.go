// Tests of capabilities a driver declares: MinTTL, FIFO order, Inspect.

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

func testMinTTL(s *suite) {
	a, _ := s.locker(s.opts())
	s.warm(a)
	minTTL := max(s.caps.MinTTL, time.Millisecond) // the Locker's own floor
	o := &dlock.Options{TTL: minTTL, NoRefresh: true}
	var slow []string
	for range 5 {
		start := time.Now()
		ls, err := a.TryAcquire(s.ctx, s.name(), o)
		took := time.Since(start)
		switch {
		case err == nil:
			// It may have expired already: ErrNotHeld is fine. Other
			// errors are logged, not failed: what is checked here is the
			// grant, and the lock is gone within MinTTL anyway.
			if err := ls.Release(s.ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
				s.t.Logf("Release of the lease with TTL = MinTTL %v: %v", minTTL, err)
			}
			return
		case errors.Is(err, dlock.ErrNotAcquired):
			s.t.Fatalf("TryAcquire with TTL = MinTTL %v on a free name: got %v, which reads as held by someone else", minTTL, err)
		case errors.Is(err, dlock.ErrGrantExpired) && took < minTTL/2:
			s.t.Fatalf("TryAcquire with TTL = MinTTL %v on a free name took %v, under half the TTL, and the grant was still expired: MinTTL cannot be granted (%v)", minTTL, took, err)
		case errors.Is(err, dlock.ErrInvalid):
			s.t.Fatalf("TryAcquire with TTL = MinTTL %v: got %v, want it accepted", minTTL, err)
		default:
			// Too slow for this TTL (the grant expired on the way, or a
			// request timed out): try again.
			slow = append(slow, fmt.Sprintf("%v after %v", err, took))
		}
	}
	s.t.Skipf("the machine is too slow to tell whether MinTTL %v can be granted: %d attempts failed, none with an error that reads as held by someone else; the last: %s", minTTL, len(slow), slow[len(slow)-1])
}

func needFIFO(c dlock.Capabilities) string {
	if !c.FIFO {
		return "FIFO"
	}
	return ""
}

// testFIFO queues waiters one after another behind a holder, releases, and
// checks the grant order. Each waiter is started once the one before it is
// seen queued on the server: a new entry in the harness's Residue (a queue
// key, node or lock-table row per waiter). Where Residue does not list
// waiters one by one there is no event to wait for, so consecutive waiters
// are started a stagger apart; a waiter that the machine delays by more than
// the stagger can then overtake the one before it, so an out-of-order round
// is run again, with twice the stagger, up to three rounds. A round
// synchronised on events is run again too (a queue may drop a waiter starved
// past its entry's life on a loaded machine), and three out of order fail.
func testFIFO(s *suite) {
	const waiters = 5
	holder, _ := s.locker(s.opts())
	ws := make([]*dlock.Locker, waiters)
	for i := range ws {
		ws[i], _ = s.locker(s.opts())
	}
	s.warm(append([]*dlock.Locker{holder}, ws...)...)
	stagger := s.live(max(100*time.Millisecond, s.cfg.TTL/5))
	for round := 1; ; round++ {
		order, synced := s.fifoRound(holder, ws, stagger)
		if slices.IsSorted(order) {
			return
		}
		switch {
		case synced && round == 3:
			s.t.Fatalf("waiters 0..%d, each seen queued on the server before the next started, were granted in the order %v (and out of order in two earlier rounds)", waiters-1, order)
		case round == 3:
			s.t.Fatalf("waiters 0..%d, started at least %v apart, were granted in the order %v (and out of order in two earlier rounds with shorter staggers)", waiters-1, stagger, order)
		case synced:
			// A queue may give up on a waiter that the machine starves for
			// longer than its entry lives; a broken queue is out of order
			// every time.
			s.t.Logf("round %d: waiters 0..%d, each seen queued before the next started, were granted in the order %v; again", round, waiters-1, order)
		default:
			s.t.Logf("round %d: waiters 0..%d started %v apart (not observable on the server) were granted in the order %v; again with twice the stagger", round, waiters-1, stagger, order)
			stagger *= 2
		}
	}
}

// fifoRound is one round of FIFOOrder on a name of its own. It returns the
// waiters' indices in grant order, and whether each waiter was seen queued
// before the next one started.
func (s *suite) fifoRound(holder *dlock.Locker, ws []*dlock.Locker, stagger time.Duration) (order []int, synced bool) {
	s.t.Helper()
	name := s.name()
	ls := s.acquire(holder, name, nil)
	residue, err := s.h.Residue(s.ctx, name)
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	granted := make(chan int, len(ws))
	errc := make(chan error, len(ws))
	synced = true
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lw, err := w.Acquire(ctx, name, nil)
			if err != nil {
				errc <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			// Sent while holding, before the release that lets the next
			// waiter in: the channel's order is the grant order.
			granted <- i
			if err := lw.Release(s.ctx); err != nil {
				errc <- fmt.Errorf("waiter %d: Release: %w", i, err)
			}
		}()
		var seen bool
		residue, seen = s.queued(name, residue, stagger)
		synced = synced && seen
	}
	s.release(ls)
	bound := s.live(time.Duration(len(ws)) * (2*s.cfg.TTL + s.caps.ExpirySlack))
	deadline := time.After(bound)
	for len(order) < len(ws) {
		select {
		case i := <-granted:
			order = append(order, i)
		case err := <-errc:
			s.t.Fatal(err)
		case <-deadline:
			s.t.Fatalf("%d of %d waiters granted within %v of the release (%d×(2×TTL + ExpirySlack)%s), in the order %v", len(order), len(ws), bound, len(ws), s.scaled(), order)
		}
	}
	return order, synced
}

// testInspect checks every field Inspect reports, for a holder, for a
// waiter and for a free name, one assertion after another: its cyclomatic
// complexity (36) counts those checks, not branches of logic, and it reads
// best as the one list it is.
func testInspect(s *suite) {
	// A TTL of seconds, whatever the suite's: the lease must stay held
	// while Inspect looks, on a loaded machine too.
	long := max(s.cfg.TTL, 3*time.Second)
	a, _ := s.locker(s.opts(ttl(long)))
	b, _ := s.locker(s.opts(ttl(long)))
	name := s.name()
	info, err := a.Inspect(s.ctx, name)
	if errors.Is(err, errors.ErrUnsupported) {
		if _, err := a.InspectPrefix(s.ctx, name); !errors.Is(err, errors.ErrUnsupported) {
			s.t.Fatalf("InspectPrefix of a driver that cannot Inspect: got %v, want errors.ErrUnsupported", err)
		}
		return
	}
	if err != nil || info.Held || info.Name != name {
		s.t.Fatalf("Inspect of a free name: %+v, %v; want not held", info, err)
	}
	const meta = "job=inspect host=conformance"
	ls := s.acquire(a, name, s.opts(ttl(long), func(o *dlock.Options) { o.Metadata = meta }))
	waitErr := make(chan error, 1)
	waitCtx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		lw, err := b.Acquire(waitCtx, name, nil)
		if err == nil {
			err = lw.Release(s.ctx)
		}
		waitErr <- err
	}()
	// The waiter shows up within a generous bound, where the backend counts
	// waiters.
	deadline := time.Now().Add(10*time.Second + s.tol())
	for {
		if info, err = a.Inspect(s.ctx, name); err != nil {
			s.t.Fatalf("Inspect of a held name: %v", err)
		}
		if info.Waiters != 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	switch f, hasFence := ls.Fence(); {
	case !info.Held:
		s.t.Fatalf("Inspect of a held name: %+v, want held", info)
	case info.Token != "" && info.Token != ls.Token()[:min(8, len(ls.Token()))]:
		s.t.Errorf("Inspect's token %q is not the first 8 digits of the lease's", info.Token)
	case len(info.Token) > 8:
		s.t.Errorf("Inspect shows %d digits of the token, want at most 8: it authorizes release", len(info.Token))
	case info.HasFence && (!hasFence || info.Fence != f):
		s.t.Errorf("Inspect's fence %d, the lease's %d (%v)", info.Fence, f, hasFence)
	case info.Metadata != "" && info.Metadata != meta:
		s.t.Errorf("Inspect's metadata %q, want %q", info.Metadata, meta)
	case info.TTL > long+time.Second || info.TTL < -1:
		s.t.Errorf("Inspect's TTL left %v, beyond the lease's TTL %v", info.TTL, long)
	case info.Waiters == 0:
		s.t.Errorf("Inspect shows no waiter while one waits")
	case !info.Since.IsZero() && info.Since.After(time.Now().Add(time.Minute)):
		s.t.Errorf("Inspect's since %v is in the future", info.Since)
	}
	all, err := a.InspectPrefix(s.ctx, name)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
	case err != nil:
		s.t.Fatalf("InspectPrefix: %v", err)
	case len(all) != 1 || all[0].Name != name || !all[0].Held:
		s.t.Errorf("InspectPrefix(%q) = %+v; want the held name alone", name, all)
	}
	s.release(ls)
	if err := <-waitErr; err != nil {
		s.t.Fatalf("waiter: %v", err)
	}
	deadline = time.Now().Add(10*time.Second + s.tol())
	for {
		if info, err = a.Inspect(s.ctx, name); err != nil {
			s.t.Fatalf("Inspect after release: %v", err)
		}
		if !info.Held && info.Waiters <= 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("Inspect after every lease was released: %+v, want nothing held or waiting", info)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
