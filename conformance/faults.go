// Tests under network faults: resets, latency and delayed refreshes, and
// attempts cut short.

package conformance

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/dlock/dlock"
)

func testResetDuringRefresh(s *suite) {
	if s.caps.ConnectionBound {
		s.resetLosesLease()
		return
	}
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	name := s.name()
	ls := s.acquire(a, name, nil)
	// Resets come every TTL/7, but never closer than the tolerance: the
	// holder's refresh must get a new connection's handshake and its
	// command through between two resets, which on a loaded machine takes
	// a few hundred milliseconds (at a 500ms TTL, resets every 71ms cut
	// every attempt: the lease was lost in 12 of 40 runs at load 11-14).
	s.keepsOut(ls, b, 2*s.cfg.TTL, max(s.cfg.TTL/7, s.tol()), fa.Reset)
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
	// ValidUntil is counted from when the request was sent, minus the
	// drift margin: a ValidUntil counted from the reply would be at least
	// the round trip (2×lag) past start+TTL, less the margin. The request
	// is sent a little after start, later on a loaded machine (6.5ms in
	// one run, past the toy driver's 5ms margin): half a one-way lag is
	// allowed for that, a quarter of what counting from the reply adds.
	if limit := start.Add(s.cfg.TTL + lag/2); ls.ValidUntil().After(limit) {
		s.t.Fatalf("ValidUntil %v past start+TTL+lag/2 (lag %v): counted from the reply, not the request?", ls.ValidUntil().Sub(limit), lag)
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

// cutGrace is how long past its ctx's end a call may spend on its own
// clean-up (deleting a waiter's key or node, cancelling a statement) while
// the server does not answer, before it returns and leaves the rest to the
// background.
const cutGrace = 500 * time.Millisecond

// testDeadlineBlackholed black-holes a locker's path and checks that its
// TryAcquire and Acquire return by their ctx's end: before any request got
// through (nothing registered yet), and while queued behind a holder. What
// a cut-short wait leaves on the server (a waiter's key or node) is the
// driver's to clean up after the call has returned, not before: once healed,
// it must not keep the name from others past its TTL (a's, 4×TTL).
func testDeadlineBlackholed(s *suite) {
	// a's TTL is long, so that a clean-up bounded by a share of the TTL,
	// not by cutGrace, shows; so is b's, whose lease must outlast a's wait
	// on a loaded machine.
	long := 4 * s.cfg.TTL
	a, fa := s.locker(s.opts(ttl(long)))
	b, _ := s.locker(s.opts(ttl(long)))
	c, _ := s.locker(s.opts())
	s.warm(a, b, c)
	name := s.name()
	healed := true
	heal := func() {
		if !healed {
			healed = true
			fa.Heal()
		}
	}
	s.t.Cleanup(heal)
	// bound is how long past its ctx's end a call may return: cutGrace for
	// the driver's own clean-up attempt, and the tolerance.
	bound := s.live(cutGrace) + s.tol()
	// want is the error the call must match, nil for any (a TryAcquire may
	// fail with the backend's error before its ctx ends).
	check := func(what string, ended time.Time, err error, want error) {
		s.t.Helper()
		if err == nil {
			s.t.Errorf("%s: acquired, want an error", what)
		} else if want != nil && (!errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, want)) {
			s.t.Errorf("%s: got %v, want ErrNotAcquired and %v", what, err, want)
		}
		if late := time.Since(ended); late > bound {
			s.t.Errorf("%s returned %v after its ctx ended, want within %v (%v + tolerance%s)", what, late.Round(time.Millisecond), bound, cutGrace, s.scaled())
		}
	}

	healed = false
	fa.Blackhole()
	for _, try := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.TTL/2)
		deadline, _ := ctx.Deadline()
		var err error
		if try {
			_, err = a.TryAcquire(ctx, name, nil)
		} else {
			_, err = a.Acquire(ctx, name, nil)
		}
		cancel()
		if try {
			check("TryAcquire, black-holed before the call,", deadline, err, nil)
		} else {
			check("Acquire, black-holed before the call,", deadline, err, context.DeadlineExceeded)
		}
	}
	heal()

	// Queued behind b's lease, then black-holed.
	lb := s.acquire(b, name, nil)
	before, err := s.h.Residue(s.ctx, name)
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		la, err := a.Acquire(ctx, name, nil)
		if err == nil {
			la.Release(s.ctx)
		}
		errc <- err
	}()
	s.queued(name, before, s.cfg.TTL/5) // let it wait
	healed = false
	fa.Blackhole()
	time.Sleep(s.cfg.TTL / 4) // let the black hole swallow what the wait sends
	cancelled := time.Now()
	cancel()
	select {
	case err := <-errc:
		check("Acquire, queued then black-holed,", cancelled, err, context.Canceled)
	case <-time.After(s.live(10 * s.cfg.TTL)):
		s.t.Fatalf("Acquire, queued then black-holed, did not return within %v (10×TTL%s) of its ctx's cancel", s.live(10*s.cfg.TTL), s.scaled())
	}
	heal()

	// Whatever a's cut-short calls left must not hold the name past its
	// TTL once b has released.
	s.release(lb)
	limit := s.live(2*long) + s.caps.ExpirySlack + s.tol()
	actx, acancel := context.WithTimeout(s.ctx, limit)
	defer acancel()
	lc, err := c.Acquire(actx, name, nil)
	if err != nil {
		s.t.Fatalf("after the black-holed calls and b's release, another locker was not granted within %v (2×a's TTL + ExpirySlack + tolerance%s): %v", limit, s.scaled(), err)
	}
	s.release(lc)
}

// testDeadlineAtGrant makes TryAcquires whose ctx ends while they run, at
// deadlines that hunt the edge between cut short and granted, so that some
// end just as the grant's last request is answered. A grant returned
// is held: its release succeeds. (A client library that ends a connection
// when a ctx it watched ends, even after the answer came, may take the
// session, and with it the lock, from under a grant just returned.)
func testDeadlineAtGrant(s *suite) {
	a, _ := s.locker(s.opts())
	s.warm(a)
	// took is the median of an uncontended TryAcquire under a ctx with a
	// deadline.
	var samples []time.Duration
	warm := s.name()
	for range 9 {
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		start := time.Now()
		ls, err := a.TryAcquire(ctx, warm, nil)
		took := time.Since(start)
		cancel()
		if err != nil {
			s.t.Fatalf("TryAcquire: %v", err)
		}
		s.release(ls)
		samples = append(samples, took)
	}
	slices.Sort(samples)
	took := samples[len(samples)/2]
	const rounds = 120
	granted := 0
	// d hunts the edge between cut short and granted, where a ctx ends as
	// the grant's last answer arrives: longer after a cut, shorter after a
	// grant. (An attempt after a cut one may take longer than took: the
	// driver may have had to discard its connection.)
	d := took
	// A name is used again after a grant released it; an attempt cut short
	// may leave a lock until its TTL, so the next one takes a new name.
	name := s.name()
	for i := range rounds {
		ctx, cancel := context.WithTimeout(s.ctx, d)
		ls, err := a.TryAcquire(ctx, name, nil)
		cancel()
		if err != nil {
			if !errors.Is(err, dlock.ErrNotAcquired) {
				s.t.Fatalf("TryAcquire cut short at %v: got %v, want ErrNotAcquired", d, err)
			}
			name = s.name()
			d = min(d*5/4, max(50*took, 200*time.Millisecond))
			continue
		}
		d = d * 9 / 10
		granted++
		if err := ls.Release(s.ctx); err != nil {
			s.t.Fatalf("round %d: TryAcquire granted with its ctx ending at %v (an attempt takes %v), then Release: %v", i, d, took, err)
		}
	}
	s.t.Logf("%d of %d attempts granted (an attempt takes %v)", granted, rounds, took)
}
