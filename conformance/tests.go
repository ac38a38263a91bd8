package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
)

var tests = []testCase{
	// Several lockers × many rounds on one name: no two leases are ever
	// inside their validity at once, and fencing tokens follow grant order.
	{name: "MutualExclusion", fn: testMutualExclusion},
	// TryAcquire makes one attempt: ErrNotAcquired (and no context error)
	// while another holds the lock, success once it is released.
	{name: "TryAcquire", fn: testTryAcquire},
	// The declared MinTTL can be granted: TryAcquire with TTL = MinTTL on a
	// free name succeeds (on a machine too slow for that, the grant is
	// reported as expired, never as held by someone else).
	{name: "MinTTLGrantable", fn: testMinTTL},
	// With FIFO declared, waiters queued one after another are granted in
	// that order.
	{name: "FIFOOrder", need: needFIFO, fn: testFIFO},
	// Inspect (when the driver can describe locks) shows the holder's token
	// prefix, fence and metadata as the lease has them, its TTL within the
	// lease's, and a queued waiter; a free name shows nothing held; a listing
	// by prefix finds the name. A driver that cannot says so with
	// errors.ErrUnsupported.
	{name: "Inspect", fn: testInspect},
	// A blocked waiter is granted promptly after the holder releases, long
	// before the holder's TTL would have run out.
	{name: "WaiterGrantedOnRelease", fn: testWaiterGrantedOnRelease},
	// A context cancelled before the call: ErrNotAcquired and
	// context.Canceled, nothing held.
	{name: "CancelBeforeWait", fn: testCancelBeforeWait},
	// Cancelled and timed-out waits return promptly with both errors and
	// leave no waiter state behind: the next TryAcquire after the release
	// succeeds.
	{name: "CancelDuringWait", fn: testCancelDuringWait},
	// An attempt cut short by its context after the request was sent (the
	// server granted it, the reply came too late) leaves no lock behind
	// that nobody holds.
	{name: "CancelledAttemptLeavesNoLock", fn: testCancelledAttempt},
	// With the locker's path black-holed, TryAcquire and Acquire return by
	// their ctx's end (plus 500ms for clean-up, and the tolerance), before
	// the wait and while queued; what they leave does not hold the name
	// past its TTL.
	{name: "DeadlineBlackholed", fn: testDeadlineBlackholed},
	// TryAcquires whose ctx ends while they run, at deadlines around an
	// attempt's length: a grant returned is held (its Release succeeds).
	{name: "DeadlineAtGrant", fn: testDeadlineAtGrant},
	// The acquire context bounds only the wait: cancelling it after the
	// grant does not end the lease.
	{name: "CancelAfterGrant", fn: testCancelAfterGrant},
	// A holder that stops refreshing loses the lock after its TTL: no one
	// else gets it before the holder's ValidUntil, the holder's loss signal
	// fires no later than ValidUntil, and its late Refresh and Release report
	// not-held without disturbing the new holder.
	{name: "ExpiryWithoutRefresh", fn: testExpiryWithoutRefresh},
	// A black-holed holder (silent partition) loses the lock the same way,
	// with its watchdog still trying.
	{name: "ExpiryBlackholed", fn: testExpiryBlackholed},
	// A manual Refresh extends the lease past its first TTL and moves
	// ValidUntil.
	{name: "RefreshExtends", fn: testRefreshExtends},
	// The watchdog keeps a lease for 3×TTL while a contender cannot
	// acquire.
	{name: "WatchdogKeepsLease", fn: testWatchdogKeepsLease},
	// After Release the watchdog is gone: the name stays free for 2×TTL.
	{name: "WatchdogStopsOnRelease", fn: testWatchdogStopsOnRelease},
	// Release twice: the second is a no-op returning nil; the lease's
	// signals say released.
	{name: "ReleaseTwice", fn: testReleaseTwice},
	// A release whose reply is lost and which is retried after another
	// holder took the lock does not delete the new holder's lock.
	{name: "RetriedReleaseKeepsNewHolder", fn: testRetriedRelease},
	// A refresh that the network delays until after the lock expired and
	// was taken over does not revive or extend the old holder's lock.
	{name: "DelayedRefreshDoesNotRevive", fn: testDelayedRefresh},
	// With Fencing declared, tokens strictly increase across holders,
	// releases and expiry takeovers; without it, no lease claims a token.
	{name: "Fencing", fn: testFencing},
	// Different names are independent; one locker holds many; Close
	// releases them all and ends pending waits with ErrClosed.
	{name: "IsolationAndClose", fn: testIsolationAndClose},
	// Close returns by its ctx's deadline with the backend hung after an
	// attempt was cut short, ends the lease it could not release and says
	// what it left; nothing it left removes a newer holder's lock. See
	// close.go.
	{name: "CloseWithinContext", fn: testCloseWithinContext},
	// Bad input is rejected with ErrInvalid before any I/O, the same on
	// every driver.
	{name: "BadInput", fn: testBadInput},
	// Connection resets while the watchdog refreshes do not lose a lease
	// that is still valid; with ConnectionBound, a reset loses the lease,
	// which says so promptly, and the locker works again afterwards.
	{name: "ResetDuringRefresh", fn: testResetDuringRefresh},
	// Under added latency acquire still works and ValidUntil accounts for
	// the time the request took.
	{name: "Latency", fn: testLatency},
	// Several lockers loop Acquire → fenced write → Release on one name
	// while a seeded nemesis black-holes, resets and slows their paths and,
	// with ServerFaults, pauses and restarts the backend: no two believed-held
	// intervals overlap (unless a declared capability allows it), fencing
	// tokens follow grant order and a checking store never sees them go
	// back, and after the last heal every locker is granted again within a
	// bound and the backend keeps nothing for the name. See chaos.go.
	{name: "Chaos", long: true, fn: testChaos},
}

func testMutualExclusion(s *suite) {
	const lockers, rounds = 4, 20
	name := s.name()
	type grant struct {
		from, to time.Time
		fence    uint64
	}
	var (
		mu     sync.Mutex
		grants []grant
		inside atomic.Int32
		wg     sync.WaitGroup
		errs   = make(chan error, lockers)
	)
	for range lockers {
		l, _ := s.locker(s.opts())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ls, err := l.Acquire(s.ctx, name, nil)
				if err != nil {
					errs <- err
					return
				}
				from := time.Now()
				if n := inside.Add(1); n != 1 {
					errs <- errors.New("two holders inside the critical section at once")
				}
				f, _ := ls.Fence()
				inside.Add(-1)
				to := time.Now()
				if vu := ls.ValidUntil(); vu.Before(to) {
					to = vu
				}
				mu.Lock()
				grants = append(grants, grant{from, to, f})
				mu.Unlock()
				if err := ls.Release(s.ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		s.t.Fatal(err)
	}
	if len(grants) != lockers*rounds {
		s.t.Fatalf("got %d grants, want %d", len(grants), lockers*rounds)
	}
	for i := range grants {
		for j := i + 1; j < len(grants); j++ {
			a, b := grants[i], grants[j]
			if a.from.Before(b.to) && b.from.Before(a.to) {
				s.t.Fatalf("leases overlap: [%v, %v] and [%v, %v]", a.from, a.to, b.from, b.to)
			}
			if s.caps.Fencing && (a.from.Before(b.from) != (a.fence < b.fence)) {
				s.t.Fatalf("fencing tokens out of grant order: %d at %v, %d at %v", a.fence, a.from, b.fence, b.from)
			}
		}
	}
}

func testTryAcquire(s *suite) {
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls, err := a.TryAcquire(s.ctx, name, nil)
	if err != nil {
		s.t.Fatalf("TryAcquire on a free name: %v", err)
	}
	_, err = b.TryAcquire(s.ctx, name, nil)
	if !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		s.t.Fatalf("TryAcquire on a held name: got %v, want ErrNotAcquired alone", err)
	}
	s.release(ls)
	lb, err := b.TryAcquire(s.ctx, name, nil)
	if err != nil {
		s.t.Fatalf("TryAcquire after release: %v", err)
	}
	s.release(lb)
}

func testWaiterGrantedOnRelease(s *suite) {
	long := 20 * s.cfg.TTL
	a, _ := s.locker(s.opts(ttl(long)))
	b, _ := s.locker(s.opts(ttl(long)))
	s.warm(a, b)
	name := s.name()
	ls := s.acquire(a, name, nil)
	before, err := s.h.Residue(s.ctx, name)
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(s.ctx, name, nil)
		if err != nil {
			errc <- err
			return
		}
		got <- lb
	}()
	// Until the waiter shows on the server, or TTL/5 (see queued); a waiter
	// that is not yet waiting only makes the test easier.
	s.queued(name, before, s.cfg.TTL/5)
	// Timed from the call to Release: the lock is free somewhere within it.
	released := time.Now()
	s.release(ls)
	// Promptly: well under the holder's remaining TTL (20×TTL), so a driver
	// that only polls at expiry fails.
	bound := s.live(2*s.cfg.TTL + s.caps.ExpirySlack)
	select {
	case lb := <-got:
		if d := time.Since(released); d > bound {
			s.t.Fatalf("waiter granted %v after Release was called, want within %v (2×TTL + ExpirySlack%s)", d, bound, s.scaled())
		}
		s.release(lb)
	case err := <-errc:
		s.t.Fatalf("waiter: %v", err)
	case <-time.After(time.Until(released.Add(bound))):
		s.t.Fatalf("waiter not granted within %v of the call to Release (2×TTL + ExpirySlack%s)", bound, s.scaled())
	}
}

func testCancelBeforeWait(s *suite) {
	a, _ := s.locker(s.opts())
	name := s.name()
	ctx, cancel := context.WithCancel(s.ctx)
	cancel()
	for _, try := range []bool{false, true} {
		var err error
		if try {
			_, err = a.TryAcquire(ctx, name, nil)
		} else {
			_, err = a.Acquire(ctx, name, nil)
		}
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			s.t.Fatalf("try=%v with a cancelled context: got %v, want ErrNotAcquired and context.Canceled", try, err)
		}
	}
	ls, err := a.TryAcquire(s.ctx, name, nil)
	if err != nil {
		s.t.Fatalf("the name should be free: %v", err)
	}
	s.release(ls)
}

func testCancelDuringWait(s *suite) {
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	c, _ := s.locker(s.opts())
	s.warm(b)
	name := s.name()
	ls := s.acquire(a, name, nil)
	before, err := s.h.Residue(s.ctx, name)
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}

	// Cancelled while waiting.
	ctx, cancel := context.WithCancel(s.ctx)
	errc := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(ctx, name, nil)
		if err == nil {
			lb.Release(s.ctx)
		}
		errc <- err
	}()
	s.queued(name, before, s.cfg.TTL/5) // let it wait
	cancelled := time.Now()
	cancel()
	bound := s.live(s.cfg.TTL)
	select {
	case err := <-errc:
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			s.t.Fatalf("cancelled wait: got %v, want ErrNotAcquired and context.Canceled", err)
		}
		if d := time.Since(cancelled); d > bound {
			s.t.Fatalf("cancelled wait returned %v after the cancel, want promptly: within %v (TTL%s)", d, bound, s.scaled())
		}
	case <-time.After(5 * bound):
		s.t.Fatalf("cancelled wait did not return within %v (5×TTL%s)", 5*bound, s.scaled())
	}

	// Timed out while waiting.
	tctx, tcancel := context.WithTimeout(s.ctx, s.cfg.TTL/4)
	defer tcancel()
	_, err = b.Acquire(tctx, name, nil)
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		s.t.Fatalf("timed-out wait: got %v, want ErrNotAcquired and context.DeadlineExceeded", err)
	}

	// No waiter state left behind: after the release, a third locker's
	// single attempt succeeds (a queue-based driver with a stale waiter
	// entry would make it fail).
	s.release(ls)
	lc, err := c.TryAcquire(s.ctx, name, nil)
	if err != nil {
		s.t.Fatalf("TryAcquire after cancelled waits and release: %v", err)
	}
	s.release(lc)
}

func testCancelAfterGrant(s *suite) {
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ctx, cancel := context.WithCancel(s.ctx)
	ls, err := a.Acquire(ctx, name, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	cancel()
	// Through a refresh or two, a contender kept out all along.
	s.keepsOut(ls, b, s.cfg.TTL, s.cfg.TTL/4, func() {})
	s.release(ls)
}
