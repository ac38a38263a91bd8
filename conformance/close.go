package conformance

import (
	"context"
	"errors"
	"time"

	"github.com/dlock/dlock"
)

// testCloseWithinContext hangs the backend (PauseServer when the harness
// has ServerFaults over all of it, else a black hole on the closing
// locker's path), cuts an attempt with a long TTL short, and closes that
// locker with a deadline shorter than the TTL: Close returns by its
// deadline, ends the lease it could not release, and says what it left.
// Once the backend is back, a newer holder's lock on the attempt's name
// outlives whatever the closed locker left to finish.
func testCloseWithinContext(s *suite) {
	// long is the attempt's TTL, which bounds its clean-up; Close has half
	// of it.
	long := max(4*time.Second, 8*s.cfg.TTL, 2*s.caps.MinTTL)
	closeIn := long / 2
	a, fa := s.locker(s.opts())
	name := s.name()
	s.warm(a)
	held := s.acquire(a, s.name(), nil)

	hang, heal := fa.Blackhole, fa.Heal
	how := "its path black-holed"
	if srv, ok := s.h.(ServerFaults); ok && !s.cfg.PartialServerFaults {
		how = "the server paused"
		hang = func() {
			if err := srv.PauseServer(s.ctx); err != nil {
				s.t.Fatalf("PauseServer: %v", err)
			}
		}
		heal = func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := srv.ResumeServer(ctx); err != nil {
				s.t.Errorf("ResumeServer: %v", err)
			}
		}
	}
	hang()
	healed := false
	doHeal := func() {
		if !healed {
			healed = true
			heal()
		}
	}
	s.t.Cleanup(doHeal)

	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.TTL/2)
	_, err := a.TryAcquire(ctx, name, &dlock.Options{TTL: long})
	cancel()
	cut := time.Now()
	if err == nil {
		s.t.Fatalf("TryAcquire with %s: got a lease, want the attempt cut short by its ctx", how)
	}

	ctx, cancel = context.WithTimeout(context.Background(), closeIn)
	start := time.Now()
	err = a.Close(ctx)
	took := time.Since(start)
	cancel()
	bound := closeIn + s.tol()
	if took > bound {
		s.t.Errorf("Close with a %v ctx, %s after an attempt with TTL %v was cut short, returned after %v, want by %v (its deadline + tolerance%s)",
			closeIn, how, long, took, bound, s.scaled())
	}
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		s.t.Logf("Close with %s took %v: %v", how, took.Round(time.Millisecond), err)
	default:
		s.t.Logf("Close with %s took %v and returned an error that does not match its ctx's: %v", how, took.Round(time.Millisecond), err)
	}
	if took >= closeIn && err == nil {
		s.t.Errorf("Close ran to its ctx's deadline (%v) and returned nil: want an error saying what it left", took)
	}
	select {
	case <-held.Done():
	default:
		s.t.Errorf("a lease of the closed locker had not ended when Close returned")
	}
	doHeal()

	// The newer holder's locker connects after the backend came back: a
	// pause may end the sessions it finds open when it resumes.
	// Its lease is long (5s at least, whatever the suite's TTL): at a 100ms
	// MinTTL, load alone can make its watchdog miss, which says nothing of
	// the clean-up.
	b, _ := s.locker(s.opts(ttl(max(s.cfg.TTL, 5*time.Second))))
	s.warm(b)
	// The attempt may reach the backend only now (a paused server reads it
	// on resuming) and hold the name for its TTL at worst; the newer
	// holder is granted then at the latest.
	ctx, cancel = context.WithTimeout(s.ctx, s.live(long+s.caps.ExpirySlack+s.cfg.TTL+2*time.Second))
	lb, err := b.Acquire(ctx, name, nil)
	cancel()
	if err != nil {
		s.t.Fatalf("Acquire after the backend came back: %v", err)
	}
	// The closed locker's clean-up is bounded by the attempt's TTL from
	// when it was cut short: past that (and a tolerance), nothing it left
	// may have touched the newer holder's lock.
	end := time.NewTimer(time.Until(cut.Add(long + s.tol())))
	defer end.Stop()
	select {
	case <-lb.Done():
		s.t.Fatalf("the newer holder's lease ended while the closed locker's clean-up ran: %v", lb.Err())
	case <-end.C:
	case <-s.ctx.Done():
		s.t.Fatal("subtest deadline passed")
	}
	s.stillHeld(lb)
	s.release(lb)
}
