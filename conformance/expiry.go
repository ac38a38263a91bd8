// Tests of a lease's validity: expiry without refresh or behind a black-hole,
// refresh and the watchdog.

package conformance

import (
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
)

// expiry runs the shared part of the expiry tests: the holder's lease is
// about to be lost (cut decides how); a contender waits for the name.
func (s *suite) expiry(holderOpts *dlock.Options, cut func(*dlock.Locker, Faults), uncut func(Faults)) {
	a, fa := s.locker(holderOpts)
	b, _ := s.locker(s.opts())
	s.warm(b)
	name := s.name()
	ls := s.acquire(a, name, nil)
	cut(a, fa)

	got := background(func() (*dlock.Lease, error) { return b.Acquire(s.ctx, name, nil) })

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

	var r grant
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
	granted := time.Now() // the contender holds from its reply on
	switch {
	case err == nil:
		s.release(lb)
		// Safety, never scaled: an attempt answered before the refreshed
		// ValidUntil was granted before it. One answered after it may
		// have been granted after it, even if sent before: it proves
		// nothing, and is made again.
		until := ls.ValidUntil()
		if granted.Before(until) {
			s.t.Fatalf("contender granted %v before the refreshed ValidUntil (sent %v after the first)", until.Sub(granted), sent.Sub(first))
		}
		return fmt.Sprintf("the contender's attempt was sent %v, and answered %v, from the refreshed ValidUntil", sent.Sub(until), granted.Sub(until))
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
		granted := time.Now() // the contender holds from its reply on
		switch {
		case err == nil:
			_ = lc.Release(s.ctx)
			// Safety, never scaled: a grant answered before the
			// holder's ValidUntil (read now: its latest) overlaps it. One
			// answered after it need not: sent before it, it may still
			// have been granted after it, the holder's watchdog having
			// failed (a loaded machine's TryAcquire can take most of a
			// TTL).
			until := ls.ValidUntil()
			if granted.Before(until) {
				s.t.Fatalf("contender granted %q %v before the holder's ValidUntil", ls.Name(), until.Sub(granted))
			}
			s.t.Fatalf("contender granted %q (attempt sent %v, answered %v, from the holder's ValidUntil): the holder's watchdog did not keep it (lease ended: %v)",
				ls.Name(), sent.Sub(until), granted.Sub(until), ls.Err())
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
