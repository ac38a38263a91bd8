// Tests of releases, fencing tokens, isolation between lockers, Close and
// input validation.

package conformance

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/dlock/dlock"
)

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
