package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// expiry runs the shared part of the expiry tests: the holder's lease is
// about to be lost (cut decides how); a contender waits for the name.
func (s *suite) expiry(holderOpts *dlock.Options, cut func(*dlock.Locker, Faults), uncut func(Faults)) {
	a, fa := s.locker(holderOpts)
	b, _ := s.locker(s.opts())
	s.warm(b)
	name := s.name()
	ls := s.acquire(a, name, nil)
	cut(a, fa)

	type result struct {
		ls  *dlock.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		lb, err := b.Acquire(s.ctx, name, nil)
		got <- result{lb, time.Now(), err}
	}()

	limit := s.live(3*s.cfg.TTL + s.caps.ExpirySlack)
	lostAt := s.waitDone(ls, limit)
	until := ls.ValidUntil()
	// Liveness: the Locker's own timer fires at ValidUntil; lateness is
	// scheduling.
	if late := lostAt.Sub(until); late > s.tol() {
		s.t.Errorf("loss signalled %v after ValidUntil, want no later than ValidUntil + tolerance %v%s", late, s.tol(), s.scaled())
	}
	if !errors.Is(ls.Err(), dlock.ErrLost) || !errors.Is(ls.Err(), dlock.ErrNotHeld) {
		s.t.Errorf("Err() after loss = %v, want ErrLost", ls.Err())
	}
	if ls.Context().Err() == nil {
		s.t.Error("lease context not cancelled after loss")
	}

	var r result
	grace := s.live(4*s.cfg.TTL + s.caps.ExpirySlack)
	select {
	case r = <-got:
	case <-time.After(time.Until(lostAt.Add(grace))):
		s.t.Fatalf("contender not granted within %v of the holder's loss (4×TTL + ExpirySlack%s)", grace, s.scaled())
	}
	if r.err != nil {
		s.t.Fatalf("contender: %v", r.err)
	}
	// Safety, never scaled: the contender's Acquire returned (it believes it
	// holds the lock) only once the holder's validity was over.
	if r.at.Before(until) {
		s.t.Fatalf("contender granted %v before the holder's ValidUntil", until.Sub(r.at))
	}
	uncut(fa)

	// The old holder's late calls report not-held and leave the new holder
	// alone (no foreign unlock).
	if err := ls.Refresh(s.ctx, 0); !errors.Is(err, dlock.ErrNotHeld) {
		s.t.Errorf("Refresh after loss: got %v, want ErrNotHeld", err)
	}
	if err := ls.Release(s.ctx); !errors.Is(err, dlock.ErrNotHeld) {
		s.t.Errorf("Release after loss: got %v, want ErrNotHeld", err)
	}
	if ok, err := ls.Held(s.ctx); ok || err != nil {
		s.t.Errorf("Held after loss = %v, %v; want false, nil", ok, err)
	}
	s.stillHeld(r.ls)
	s.release(r.ls)
}

func testExpiryWithoutRefresh(s *suite) {
	s.expiry(s.opts(noRefresh), func(*dlock.Locker, Faults) {}, func(Faults) {})
}

func testExpiryBlackholed(s *suite) {
	s.expiry(s.opts(), func(_ *dlock.Locker, f Faults) { f.Blackhole() }, func(f Faults) { f.Heal() })
}

func testRefreshExtends(s *suite) {
	a, _ := s.locker(s.opts(noRefresh))
	b, _ := s.locker(s.opts())
	s.warm(a, b)
	// The checks need the process to run on time (the contender's attempt
	// between the first and the refreshed ValidUntil, 0.4×TTL apart): an
	// attempt that a stalled machine made too late proves nothing either
	// way, and is made again.
	for attempt := 1; ; attempt++ {
		late := s.refreshExtends(a, b)
		if late == "" {
			return
		}
		if attempt == 3 {
			s.t.Fatalf("three attempts came too late to check anything (last: %s): the machine is too slow; raise %s", late, ToleranceScaleEnv)
		}
		s.t.Logf("attempt %d came too late to check anything (%s); again", attempt, late)
	}
}

// refreshExtends is one attempt of RefreshExtends. It returns why it could
// not tell ("" once every check passed).
func (s *suite) refreshExtends(a, b *dlock.Locker) (late string) {
	name := s.name()
	ls := s.acquire(a, name, nil)
	defer func() { _ = ls.Release(s.ctx) }()
	first := ls.ValidUntil()
	time.Sleep(s.cfg.TTL / 2)
	if err := ls.Refresh(s.ctx, 0); err != nil {
		if now := time.Now(); !now.Before(first) {
			return fmt.Sprintf("the refresh returned %v after the first ValidUntil", now.Sub(first))
		}
		s.t.Fatalf("Refresh: %v", err)
	}
	if !ls.ValidUntil().After(first) {
		s.t.Fatalf("ValidUntil did not move: %v then %v", first, ls.ValidUntil())
	}
	// Past the first TTL, the lock is still there.
	time.Sleep(time.Until(first.Add(s.cfg.TTL / 10)))
	sent := time.Now()
	lb, err := b.TryAcquire(s.ctx, name, nil)
	switch {
	case err == nil:
		s.release(lb)
		// Safety, never scaled.
		if until := ls.ValidUntil(); sent.Before(until) {
			s.t.Fatalf("contender granted %v before the refreshed ValidUntil (%v after the first)", until.Sub(sent), sent.Sub(first))
		}
		return fmt.Sprintf("the contender tried %v after the refreshed ValidUntil", sent.Sub(ls.ValidUntil()))
	case !errors.Is(err, dlock.ErrNotAcquired):
		s.t.Fatalf("contender after the first TTL: got %v, want ErrNotAcquired", err)
	}
	if now := time.Now(); !now.Before(ls.ValidUntil()) {
		return fmt.Sprintf("the contender's attempt returned %v after the refreshed ValidUntil", now.Sub(ls.ValidUntil()))
	}
	s.stillHeld(ls)
	// A longer TTL is honoured too.
	if err := ls.Refresh(s.ctx, 3*s.cfg.TTL); err != nil {
		if now := time.Now(); !now.Before(ls.ValidUntil()) {
			return fmt.Sprintf("Refresh(3×TTL) returned %v after the refreshed ValidUntil", now.Sub(ls.ValidUntil()))
		}
		s.t.Fatalf("Refresh(3×TTL): %v", err)
	}
	if got := ls.TTL(); got < 3*s.cfg.TTL {
		s.t.Fatalf("TTL() after Refresh(3×TTL) = %v", got)
	}
	s.release(ls)
	return ""
}

func testWatchdogKeepsLease(s *suite) {
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	s.keepsOut(ls, b, 3*s.cfg.TTL, s.cfg.TTL/4, func() {})
	s.release(ls)
}

// keepsOut checks, every period for d, that contender cannot take ls's
// name, calling fault before each check; then that ls is still held.
func (s *suite) keepsOut(ls *dlock.Lease, contender *dlock.Locker, d, every time.Duration, fault func()) {
	s.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(every) {
		fault()
		sent := time.Now()
		lc, err := contender.TryAcquire(s.ctx, ls.Name(), nil)
		switch {
		case err == nil:
			_ = lc.Release(s.ctx)
			if until := ls.ValidUntil(); sent.Before(until) { // safety
				s.t.Fatalf("contender granted %q %v before the holder's ValidUntil", ls.Name(), until.Sub(sent))
			}
			s.t.Fatalf("contender granted %q: the holder's watchdog did not keep it (lease ended: %v)", ls.Name(), ls.Err())
		case !errors.Is(err, dlock.ErrNotAcquired):
			s.t.Fatalf("contender while %q is held: got %v, want ErrNotAcquired", ls.Name(), err)
		}
	}
	s.stillHeld(ls)
}

func testWatchdogStopsOnRelease(s *suite) {
	a, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	time.Sleep(s.cfg.TTL / 2) // let the watchdog get going
	s.release(ls)
	end := time.Now().Add(2 * s.cfg.TTL)
	for time.Now().Before(end) {
		left, err := s.h.Residue(s.ctx, name)
		if err != nil {
			s.t.Fatalf("Residue: %v", err)
		}
		if len(left) != 0 {
			s.t.Fatalf("after Release the backend stores %v for the name", left)
		}
		time.Sleep(s.cfg.TTL / 8)
	}
}

func testReleaseTwice(s *suite) {
	a, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	s.release(ls)
	if err := ls.Release(s.ctx); err != nil {
		s.t.Fatalf("second Release: got %v, want nil", err)
	}
	select {
	case <-ls.Done():
	default:
		s.t.Fatal("Done not closed after Release")
	}
	if !errors.Is(ls.Err(), dlock.ErrReleased) || !errors.Is(context.Cause(ls.Context()), dlock.ErrReleased) {
		s.t.Fatalf("after Release Err() = %v, context cause = %v; want ErrReleased", ls.Err(), context.Cause(ls.Context()))
	}
	if err := ls.Refresh(s.ctx, 0); !errors.Is(err, dlock.ErrNotHeld) {
		s.t.Fatalf("Refresh after Release: got %v, want ErrNotHeld", err)
	}
}

func testRetriedRelease(s *suite) {
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	// Slow a's path so its release request arrives but the reply comes too
	// late for the caller, who gives up.
	lag := s.cfg.TTL / 5
	fa.SetLatency(lag)
	ctx, cancel := context.WithTimeout(s.ctx, lag*3/2)
	err := ls.Release(ctx)
	cancel()
	if err == nil {
		s.t.Fatalf("Release returned nil within %v though its reply needs %v: latency not in effect", lag*3/2, 2*lag)
	}
	// Someone else takes the lock meanwhile.
	lb := s.acquire(b, name, nil)
	fa.SetLatency(0)
	// The retried release must not remove b's lock.
	if err := ls.Release(s.ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		s.t.Fatalf("retried Release: got %v, want nil or ErrNotHeld", err)
	}
	s.stillHeld(lb)
	s.release(lb)
}

func testFencing(s *suite) {
	if !s.caps.Fencing {
		a, _ := s.locker(s.opts())
		ls := s.acquire(a, s.name(), nil)
		if f, ok := ls.Fence(); ok {
			s.t.Fatalf("Fence() = %d, true from a driver that does not declare Fencing", f)
		}
		s.release(ls)
		return
	}
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts(noRefresh))
	c, _ := s.locker(s.opts())
	name := s.name()
	var last uint64
	next := func(ls *dlock.Lease, how string) {
		s.t.Helper()
		f, ok := ls.Fence()
		if !ok {
			s.t.Fatalf("%s: no fencing token though the driver declares Fencing", how)
		}
		if f <= last {
			s.t.Fatalf("%s: fencing token %d does not exceed the previous %d", how, f, last)
		}
		last = f
	}
	for i := range 3 {
		ls := s.acquire(a, name, nil)
		next(ls, "re-acquire by the same locker")
		s.release(ls)
		ls = s.acquire(b, name, nil)
		next(ls, "another holder")
		if i < 2 {
			s.release(ls)
			continue
		}
		// Expiry takeover: b stops refreshing and c takes over.
		lc := s.acquire(c, name, nil)
		next(lc, "takeover after expiry")
		s.release(lc)
	}
}

func testIsolationAndClose(s *suite) {
	// Nothing here is about TTLs, and a lock lost at a short one (a
	// watchdog late on a loaded machine) would hand the waiter the lock
	// before Close ends its wait: a TTL long enough for any load.
	o := s.opts(ttl(max(s.cfg.TTL, 5*time.Second)))
	a, _ := s.locker(o)
	b, _ := s.locker(o)
	w, _ := s.locker(o)
	var leases []*dlock.Lease
	var names []string
	for range 10 {
		n := s.name()
		names = append(names, n)
		leases = append(leases, s.acquire(a, n, nil))
	}
	// Another name is unaffected.
	other := s.name()
	lo, err := b.TryAcquire(s.ctx, other, nil)
	if err != nil {
		s.t.Fatalf("TryAcquire of an unrelated name: %v", err)
	}
	s.release(lo)
	// A waiter on another locker, ended by that locker's Close.
	before, err := s.h.Residue(s.ctx, names[0])
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := w.Acquire(s.ctx, names[0], nil)
		waitErr <- err
	}()
	s.queued(names[0], before, s.cfg.TTL/5)
	if err := w.Close(s.ctx); err != nil {
		s.t.Fatalf("Close of the waiting locker: %v", err)
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, dlock.ErrClosed) {
			s.t.Fatalf("wait ended by Close: got %v, want ErrClosed", err)
		}
	case <-time.After(s.live(5 * s.cfg.TTL)):
		s.t.Fatalf("Close did not end the wait within %v (5×TTL%s)", s.live(5*s.cfg.TTL), s.scaled())
	}
	if _, err := w.TryAcquire(s.ctx, other, nil); !errors.Is(err, dlock.ErrClosed) {
		s.t.Fatalf("TryAcquire on a closed locker: got %v, want ErrClosed", err)
	}
	// Close releases everything a holds.
	if err := a.Close(s.ctx); err != nil {
		s.t.Fatalf("Close: %v", err)
	}
	for _, ls := range leases {
		select {
		case <-ls.Done():
		default:
			s.t.Fatalf("lease %q not ended by Close", ls.Name())
		}
	}
	for _, n := range names {
		lb, err := b.TryAcquire(s.ctx, n, nil)
		if err != nil {
			s.t.Fatalf("TryAcquire(%q) after the holder's Close: %v", n, err)
		}
		s.release(lb)
	}
}

func testBadInput(s *suite) {
	a, _ := s.locker(s.opts())
	minTTL := max(s.caps.MinTTL, time.Millisecond)
	cases := []struct {
		what string
		name string
		o    *dlock.Options
	}{
		{"empty name", "", nil},
		{"invalid UTF-8", "bad\xff", nil},
		{"NUL byte", "a\x00b", nil},
		{"over-long name", strings.Repeat("n", dlock.MaxNameLen+1), nil},
		{"negative TTL", "ok", &dlock.Options{TTL: -time.Second}},
		{"TTL below the minimum", "ok", &dlock.Options{TTL: minTTL - time.Nanosecond}},
		{"refresh interval not below TTL", "ok", &dlock.Options{TTL: s.cfg.TTL, RefreshInterval: s.cfg.TTL}},
		{"metadata too long", "ok", &dlock.Options{Metadata: strings.Repeat("m", dlock.MaxMetadataLen+1)}},
		{"inverted retry range", "ok", &dlock.Options{RetryMin: time.Second, RetryMax: time.Millisecond}},
	}
	for _, tc := range cases {
		if _, err := a.TryAcquire(s.ctx, tc.name, tc.o); !errors.Is(err, dlock.ErrInvalid) {
			s.t.Errorf("TryAcquire with %s: got %v, want ErrInvalid", tc.what, err)
		}
		if _, err := a.Acquire(s.ctx, tc.name, tc.o); !errors.Is(err, dlock.ErrInvalid) {
			s.t.Errorf("Acquire with %s: got %v, want ErrInvalid", tc.what, err)
		}
	}
	// The longest valid name works, and multi-byte and slash-laden names
	// are accepted alike.
	for _, n := range []string{strings.Repeat("n", dlock.MaxNameLen-len(s.t.Name())-40), "über/../sla/sh\\ é 鍵 \x01"} {
		full := s.name() + n
		s.names[len(s.names)-1] = full
		ls, err := a.TryAcquire(s.ctx, full, nil)
		if err != nil {
			s.t.Fatalf("TryAcquire of a valid name %q: %v", full, err)
		}
		if err := ls.Refresh(s.ctx, -time.Second); !errors.Is(err, dlock.ErrInvalid) {
			s.t.Errorf("Refresh with a negative TTL: got %v, want ErrInvalid", err)
		}
		s.release(ls)
	}
}

func testResetDuringRefresh(s *suite) {
	if s.caps.ConnectionBound {
		s.resetLosesLease()
		return
	}
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	s.keepsOut(ls, b, 2*s.cfg.TTL, s.cfg.TTL/7, fa.Reset)
	s.release(ls)
}

// resetLosesLease is ResetDuringRefresh for a ConnectionBound driver: the
// reset ends the holder's connection, and with it the lock; the lease must
// report the loss well before its ValidUntil (within a third of the TTL, the
// watchdog's period), another locker then gets the name, and the reset
// locker can take locks again.
func (s *suite) resetLosesLease() {
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	time.Sleep(s.cfg.TTL / 4) // let the watchdog get going
	s.stillHeld(ls)
	reset := time.Now()
	fa.Reset()
	lostAt := s.waitDone(ls, s.live(s.cfg.TTL))
	if d, limit := lostAt.Sub(reset), s.cfg.TTL/3+s.tol(); d > limit {
		s.t.Errorf("loss signalled %v after the reset, want within %v (TTL/3 + tolerance %v%s)", d, limit, s.tol(), s.scaled())
	}
	if !errors.Is(ls.Err(), dlock.ErrLost) {
		s.t.Errorf("Err() after the reset = %v, want ErrLost", ls.Err())
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.live(2*s.cfg.TTL))
	lb, err := b.Acquire(ctx, name, nil)
	cancel()
	if err != nil {
		s.t.Fatalf("contender after the holder's reset, within %v (2×TTL%s): %v", s.live(2*s.cfg.TTL), s.scaled(), err)
	}
	s.release(lb)
	la := s.acquire(a, name, nil)
	s.stillHeld(la)
	s.release(la)
}

func testLatency(s *suite) {
	a, fa := s.locker(s.opts())
	name := s.name()
	// Warm the locker up first: connection set-up and script loading cost
	// round trips that, slowed down, would eat the first lease's validity.
	s.warm(a)
	lag := s.cfg.TTL / 20
	fa.SetLatency(lag)
	start := time.Now()
	ls := s.acquire(a, name, nil)
	// ValidUntil is counted from when the request was sent, so it is at
	// least the round trip short of start+TTL.
	if limit := start.Add(s.cfg.TTL); ls.ValidUntil().After(limit) {
		s.t.Fatalf("ValidUntil %v past start+TTL", ls.ValidUntil().Sub(limit))
	}
	s.stillHeld(ls)
	fa.SetLatency(0)
	s.release(ls)
}

func testDelayedRefresh(s *suite) {
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	s.warm(a, b)
	name := s.name()
	ls := s.acquire(a, name, nil)
	// The loss is timed as it happens, not when b's wait is over: the
	// backend may keep the lock up to ExpirySlack past a's ValidUntil.
	lost := make(chan time.Time, 1)
	go func() {
		select {
		case <-ls.Done():
			lost <- time.Now()
		case <-s.ctx.Done():
		}
	}()
	// From now on a's requests arrive a TTL late: its first watchdog refresh
	// reaches the server after the lock has expired.
	fa.SetLatency(s.cfg.TTL)
	start := time.Now()
	lb := s.acquire(b, name, nil)
	grantedAt := time.Now() // b's Acquire returned: b believes it holds the lock
	var lostAt time.Time
	select {
	case lostAt = <-lost:
	case <-time.After(s.live(s.cfg.TTL) + s.tol()):
		s.t.Fatalf("lease %q did not end within %v of b's grant (TTL + tolerance%s)", ls.Name(), s.live(s.cfg.TTL)+s.tol(), s.scaled())
	}
	until := ls.ValidUntil()
	// Safety, never scaled: b holds only once a's validity is over.
	if grantedAt.Before(until) {
		s.t.Fatalf("b granted %v before a's ValidUntil", until.Sub(grantedAt))
	}
	// Liveness: the Locker's timer fires at ValidUntil.
	if late := lostAt.Sub(until); late > s.tol() {
		s.t.Errorf("loss signalled %v after ValidUntil, want no later than ValidUntil + tolerance %v%s", late, s.tol(), s.scaled())
	}
	// Liveness: the backend frees the lock by ExpirySlack after ValidUntil,
	// and b's wait notices it and gets the reply within the tolerance.
	if late, bound := grantedAt.Sub(until), s.caps.ExpirySlack+s.tol(); late > bound {
		s.t.Errorf("b granted %v after a's ValidUntil, want within %v (ExpirySlack %v + tolerance %v%s)", late, bound, s.caps.ExpirySlack, s.tol(), s.scaled())
	}
	// Let every delayed request of a's arrive (sent before its loss at
	// most TTL after start, delivered a TTL later).
	time.Sleep(time.Until(start.Add(2*s.cfg.TTL + s.cfg.TTL/2)))
	fa.SetLatency(0)
	s.stillHeld(lb)
	s.release(lb)
}

func testCancelledAttempt(s *suite) {
	long := 20 * s.cfg.TTL
	a, fa := s.locker(s.opts(ttl(long)))
	b, _ := s.locker(s.opts())
	name := s.name()
	s.warm(a, b)
	lag := s.cfg.TTL / 5
	fa.SetLatency(lag)
	for _, try := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(s.ctx, lag*3/2)
		var err error
		if try {
			_, err = a.TryAcquire(ctx, name, nil)
		} else {
			_, err = a.Acquire(ctx, name, nil)
		}
		cancel()
		if err == nil {
			s.t.Fatalf("try=%v: acquired within %v though a round trip takes %v", try, lag*3/2, 2*lag)
		}
		// A lock left behind would hold the name for 20×TTL; the abandoned
		// grant must be gone within a few round trips.
		ctx, cancel = context.WithTimeout(s.ctx, s.live(2*s.cfg.TTL))
		lb, err := b.Acquire(ctx, name, nil)
		cancel()
		if err != nil {
			s.t.Fatalf("try=%v: the name is still taken %v (2×TTL%s) after the cancelled attempt: %v", try, s.live(2*s.cfg.TTL), s.scaled(), err)
		}
		s.release(lb)
	}
	fa.SetLatency(0)
}

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
