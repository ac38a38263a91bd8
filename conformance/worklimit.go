// Tests of a lease tied to its work: Options.MaxHold and the work's
// heartbeat (Options.HeartbeatTimeout, Lease.Heartbeat).

package conformance

import (
	"errors"
	"time"

	"github.com/dlock/dlock"
)

var workTests = []testCase{
	// A lease whose work calls Heartbeat is kept past its TTL while a waiter
	// waits; once the work stops, the lease ends at its ValidUntil, at most
	// HeartbeatTimeout + TTL after the last heartbeat, with ErrLost and
	// ErrHeartbeatTimeout, and the waiter is granted within HeartbeatTimeout
	// + TTL + ExpirySlack of it, never before the holder's ValidUntil.
	{name: "HeartbeatTimeout", fn: testHeartbeatTimeout},
	// A lease with MaxHold is kept until MaxHold, then ends at its
	// ValidUntil, at most MaxHold + TTL after the grant, with ErrLost and
	// ErrMaxHold; a waiter is granted within MaxHold + TTL + ExpirySlack of
	// the grant, never before the holder's ValidUntil.
	{name: "MaxHold", fn: testMaxHold},
}

func testHeartbeatTimeout(s *suite) {
	// The test's own heartbeat loop must not stall for a HeartbeatTimeout:
	// it is scaled as a liveness bound.
	hb := s.live(s.cfg.TTL / 2)
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	s.warm(a, b)
	name := s.name()
	ls := s.acquire(a, name, s.opts(func(o *dlock.Options) { o.HeartbeatTimeout = hb }))
	got := background(func() (*dlock.Lease, error) { return b.Acquire(s.ctx, name, nil) })

	// Safety: while the work heartbeats, for a TTL (the watchdog refreshes
	// twice or more), the lease is kept and the waiter waits.
	every := hb / 10
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last time.Time
	for end := time.Now().Add(s.cfg.TTL); time.Now().Before(end); {
		ls.Heartbeat()
		now := time.Now()
		if gap := now.Sub(last); !last.IsZero() && gap > hb {
			s.t.Fatalf("the test's heartbeats came %v apart, over the HeartbeatTimeout %v: the machine is too slow; raise %s", gap, hb, ToleranceScaleEnv)
		}
		last = now
		select {
		case <-ls.Done():
			s.t.Fatalf("lease lost while its work heartbeats (every %v, timeout %v): %v", every, hb, ls.Err())
		case r := <-got:
			s.grantedEarly(ls, r)
		case <-tick.C:
		}
	}
	s.workEnd(ls, got, last, hb, dlock.ErrHeartbeatTimeout)
}

func testMaxHold(s *suite) {
	maxHold := s.cfg.TTL + s.cfg.TTL/2
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	s.warm(a, b)
	name := s.name()
	before := time.Now()
	// Heartbeats do not stretch MaxHold: none is sent after the grant.
	ls := s.acquire(a, name, s.opts(func(o *dlock.Options) { o.MaxHold, o.HeartbeatTimeout = maxHold, time.Hour }))
	after := time.Now()
	got := background(func() (*dlock.Lease, error) { return b.Acquire(s.ctx, name, nil) })

	// The watchdog keeps the lease until MaxHold has passed since the
	// grant's request, sent after before.
	select {
	case <-ls.Done():
		s.t.Fatalf("lease lost %v after the acquisition began, before its MaxHold %v: %v", time.Since(before), maxHold, ls.Err())
	case r := <-got:
		s.grantedEarly(ls, r)
	case <-time.After(time.Until(before.Add(maxHold))):
	}
	s.workEnd(ls, got, after, maxHold, dlock.ErrMaxHold)
}

// grantedEarly fails the test for a waiter granted while the holder was
// to keep the lease.
func (s *suite) grantedEarly(ls *dlock.Lease, r grant) {
	s.t.Helper()
	if r.err != nil {
		s.t.Fatalf("waiter: %v", r.err)
	}
	_ = r.ls.Release(s.ctx)
	if until := ls.ValidUntil(); r.at.Before(until) {
		s.t.Fatalf("waiter granted %v before the holder's ValidUntil", until.Sub(r.at))
	}
	s.t.Fatalf("waiter granted while the holder was to keep the lease (holder's lease: %v)", ls.Err())
}

// workEnd checks the end of a lease whose work's bound (HeartbeatTimeout
// or MaxHold) started at from at the latest: the loss is signalled at
// ValidUntil, itself no later than from + bound + TTL; its error matches
// ErrLost and want; the waiter behind got is granted within bound + TTL +
// ExpirySlack of from, never before ValidUntil.
func (s *suite) workEnd(ls *dlock.Lease, got <-chan grant, from time.Time, bound time.Duration, want error) {
	s.t.Helper()
	ttl := ls.TTL()
	limit := s.live(bound+ttl+s.caps.ExpirySlack) + s.tol()
	lostAt := s.waitDone(ls, time.Until(from.Add(limit)))
	until := ls.ValidUntil()
	// Safety of the bound, never scaled: the last refresh was sent before
	// the bound ran out.
	if until.After(from.Add(bound + ttl)) {
		s.t.Errorf("ValidUntil %v after the bound's start, past bound + TTL = %v", until.Sub(from), bound+ttl)
	}
	if late := lostAt.Sub(until); late > s.tol() {
		s.t.Errorf("loss signalled %v after ValidUntil, want no later than ValidUntil + tolerance %v%s", late, s.tol(), s.scaled())
	}
	if err := ls.Err(); !errors.Is(err, dlock.ErrLost) || !errors.Is(err, want) {
		s.t.Errorf("Err() after the loss = %v, want ErrLost and %v", err, want)
	}
	var r grant
	select {
	case r = <-got:
	case <-time.After(time.Until(from.Add(limit))):
		s.t.Fatalf("waiter not granted within %v of the bound's start (bound %v + TTL %v + ExpirySlack %v + tolerance%s)",
			limit, bound, ttl, s.caps.ExpirySlack, s.scaled())
	}
	if r.err != nil {
		s.t.Fatalf("waiter: %v", r.err)
	}
	// Safety, never scaled.
	if r.at.Before(until) {
		s.t.Fatalf("waiter granted %v before the holder's ValidUntil", until.Sub(r.at))
	}
	s.release(r.ls)
}
