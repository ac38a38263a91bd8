package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memory"
)

// grantDriver grants every attempt and counts refreshes. It refreshes one
// lease per request (no driver.BatchRefresher), so the watchdog's ticks run
// one by one, unlike the memory driver's batches.
type grantDriver struct {
	calls     atomic.Int32 // every driver call
	refreshes atomic.Int32
}

func (d *grantDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *grantDriver) Close() error                     { return nil }

func (d *grantDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	d.calls.Add(1)
	return &driver.Grant{Handle: grantHandle{d}}, nil
}

type grantHandle struct{ d *grantDriver }

func (h grantHandle) Refresh(context.Context, time.Duration) (time.Duration, error) {
	h.d.calls.Add(1)
	h.d.refreshes.Add(1)
	return 0, nil
}
func (h grantHandle) Held(context.Context) (bool, error) { h.d.calls.Add(1); return true, nil }
func (h grantHandle) Release(context.Context) error      { h.d.calls.Add(1); return nil }

// beatFor calls ls.Heartbeat every 5ms for d, failing the test if the
// lease ends meanwhile (a heartbeating lease is never lost); it returns
// when it made the last call.
func beatFor(t *testing.T, ls *dlock.Lease, d time.Duration) time.Time {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last time.Time
	for end := time.Now().Add(d); time.Now().Before(end); {
		ls.Heartbeat()
		last = time.Now()
		select {
		case <-ls.Done():
			t.Fatalf("lease lost while its work heartbeats: %v", ls.Err())
		case <-tick.C:
		}
	}
	return last
}

// waitEnd waits up to limit for ls to end and returns when it did.
func waitEnd(t *testing.T, ls *dlock.Lease, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-ls.Done():
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("lease not ended %v after it should have", limit)
	}
	return time.Time{}
}

// slack is the lateness allowed to a timer on a loaded machine.
const slack = 500 * time.Millisecond

// A lease whose work stops heartbeating is refreshed while it beats, then
// ends at its ValidUntil, HeartbeatTimeout + TTL after the last beat at
// the latest, with ErrLost and ErrHeartbeatTimeout; a waiter gets the lock.
// Memory refreshes in batches; grantDriver one lease at a time.
func TestHeartbeatTimeout(t *testing.T) {
	ctx := context.Background()
	const ttl, hb = 300 * time.Millisecond, 150 * time.Millisecond
	opts := &dlock.Options{TTL: ttl, HeartbeatTimeout: hb}
	t.Run("memory", func(t *testing.T) {
		l, err := memory.New(memory.NewStore(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(ctx)
		ls, err := l.Acquire(ctx, "work", opts)
		if err != nil {
			t.Fatal(err)
		}
		type grant struct {
			ls *dlock.Lease
			at time.Time
		}
		got := make(chan grant, 1)
		go func() {
			w, err := l.Acquire(ctx, "work", &dlock.Options{TTL: ttl})
			if err != nil {
				t.Error(err)
			}
			got <- grant{w, time.Now()}
		}()
		last := beatFor(t, ls, 3*ttl)
		lostAt := waitEnd(t, ls, hb+ttl+slack)
		if lostAt.After(last.Add(hb + ttl + slack)) {
			t.Errorf("lost %v after the last heartbeat, want within HeartbeatTimeout + TTL = %v", lostAt.Sub(last), hb+ttl)
		}
		if vu := ls.ValidUntil(); vu.After(last.Add(hb + ttl)) {
			t.Errorf("valid until %v after the last heartbeat, past HeartbeatTimeout + TTL = %v", vu.Sub(last), hb+ttl)
		}
		checkWorkLoss(t, ls, dlock.ErrHeartbeatTimeout, dlock.ErrMaxHold)
		w := <-got
		if w.ls == nil {
			return
		}
		if w.at.Before(ls.ValidUntil()) {
			t.Errorf("waiter granted %v before the holder's ValidUntil", ls.ValidUntil().Sub(w.at))
		}
		_ = w.ls.Release(ctx)
	})
	t.Run("one-by-one", func(t *testing.T) {
		d := &grantDriver{}
		l, err := dlock.New(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(ctx)
		ls, err := l.Acquire(ctx, "work", opts)
		if err != nil {
			t.Fatal(err)
		}
		last := beatFor(t, ls, 3*ttl)
		if n := d.refreshes.Load(); n < 2 {
			t.Errorf("%d refreshes while the work heartbeat for 3×TTL, want the watchdog's", n)
		}
		lostAt := waitEnd(t, ls, hb+ttl+slack)
		if lostAt.After(last.Add(hb + ttl + slack)) {
			t.Errorf("lost %v after the last heartbeat, want within HeartbeatTimeout + TTL = %v", lostAt.Sub(last), hb+ttl)
		}
		if vu := ls.ValidUntil(); vu.After(last.Add(hb + ttl)) {
			t.Errorf("valid until %v after the last heartbeat, past HeartbeatTimeout + TTL = %v", vu.Sub(last), hb+ttl)
		}
		checkWorkLoss(t, ls, dlock.ErrHeartbeatTimeout, dlock.ErrMaxHold)
		// A late heartbeat changes nothing.
		ls.Heartbeat()
		if err := ls.Release(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Errorf("Release after the loss: got %v, want ErrLost", err)
		}
	})
}

// checkWorkLoss checks the error of a lease ended by its work's bound.
func checkWorkLoss(t *testing.T, ls *dlock.Lease, want, notWant error) {
	t.Helper()
	err := ls.Err()
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, want) {
		t.Errorf("Err() = %v, want ErrLost and %v", err, want)
	}
	if errors.Is(err, notWant) {
		t.Errorf("Err() = %v, matches %v too", err, notWant)
	}
	if cause := context.Cause(ls.Context()); !errors.Is(cause, want) {
		t.Errorf("Context's cause = %v, want %v", cause, want)
	}
}

// A lease is kept until its MaxHold, then ends at its ValidUntil, MaxHold +
// TTL after the grant at the latest, with ErrLost and ErrMaxHold; a waiter
// gets the lock.
func TestMaxHold(t *testing.T) {
	ctx := context.Background()
	const ttl, maxHold = 150 * time.Millisecond, 400 * time.Millisecond
	for _, tc := range []struct {
		name string
		l    func(t *testing.T) *dlock.Locker
	}{
		{"memory", func(t *testing.T) *dlock.Locker {
			l, err := memory.New(memory.NewStore(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
		{"one-by-one", func(t *testing.T) *dlock.Locker {
			l, err := dlock.New(&grantDriver{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.l(t)
			defer l.Close(ctx)
			before := time.Now()
			// Heartbeats do not stretch MaxHold.
			ls, err := l.Acquire(ctx, "work", &dlock.Options{TTL: ttl, MaxHold: maxHold, HeartbeatTimeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			for !time.Now().After(after.Add(maxHold)) {
				ls.Heartbeat()
				select {
				case <-ls.Done():
					t.Fatalf("lease lost %v after the grant, before its MaxHold %v: %v", time.Since(before), maxHold, ls.Err())
				case <-time.After(5 * time.Millisecond):
				}
			}
			lostAt := waitEnd(t, ls, ttl+slack)
			if lostAt.After(after.Add(maxHold + ttl + slack)) {
				t.Errorf("lost %v after the grant, want within MaxHold + TTL = %v", lostAt.Sub(after), maxHold+ttl)
			}
			if vu := ls.ValidUntil(); vu.After(after.Add(maxHold + ttl)) {
				t.Errorf("valid until %v after the grant, past MaxHold + TTL = %v", vu.Sub(after), maxHold+ttl)
			}
			checkWorkLoss(t, ls, dlock.ErrMaxHold, dlock.ErrHeartbeatTimeout)
			// The server may keep the lock until its TTL, a drift margin
			// after the ValidUntil.
			wctx, cancel := context.WithTimeout(ctx, slack)
			defer cancel()
			w, err := l.Acquire(wctx, "work", nil)
			if err != nil {
				t.Fatalf("Acquire after the holder's MaxHold: %v", err)
			}
			_ = w.Release(ctx)
		})
	}
}

// Past MaxHold a manual Refresh is refused with ErrMaxHold and leaves the
// lease as it was, valid until its ValidUntil.
func TestMaxHoldRefusesRefresh(t *testing.T) {
	ctx := context.Background()
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	const ttl = 100 * time.Millisecond
	ls, err := l.Acquire(ctx, "work", &dlock.Options{TTL: ttl, MaxHold: ttl, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	// Before MaxHold the holder may refresh, for longer than MaxHold too.
	if err := ls.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatalf("Refresh before MaxHold: %v", err)
	}
	time.Sleep(time.Until(after.Add(ttl)))
	until := ls.ValidUntil()
	if err := ls.Refresh(ctx, 0); !errors.Is(err, dlock.ErrMaxHold) || errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh past MaxHold: got %v, want ErrMaxHold (and not ErrNotHeld)", err)
	}
	if ls.Err() != nil || !ls.ValidUntil().Equal(until) {
		t.Errorf("refused Refresh changed the lease: Err %v, ValidUntil moved by %v", ls.Err(), ls.ValidUntil().Sub(until))
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Bad MaxHold and HeartbeatTimeout values are ErrInvalid, in an
// acquisition's Options and in a Locker's defaults, before any I/O.
func TestWorkLimitsBadInput(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		o    dlock.Options
	}{
		{"negative MaxHold", dlock.Options{TTL: time.Second, MaxHold: -time.Second}},
		{"MaxHold below TTL", dlock.Options{TTL: time.Second, MaxHold: time.Second - 1}},
		{"MaxHold below the default TTL", dlock.Options{MaxHold: dlock.DefaultTTL / 2}},
		{"negative HeartbeatTimeout", dlock.Options{TTL: time.Second, HeartbeatTimeout: -time.Second}},
		{"HeartbeatTimeout without refresh", dlock.Options{TTL: time.Second, HeartbeatTimeout: time.Second, NoRefresh: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &grantDriver{}
			l, err := dlock.New(d, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(ctx)
			if _, err := l.TryAcquire(ctx, "x", &tc.o); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("TryAcquire: got %v, want ErrInvalid", err)
			}
			if _, err := l.Acquire(ctx, "x", &tc.o); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("Acquire: got %v, want ErrInvalid", err)
			}
			if n := d.calls.Load(); n != 0 {
				t.Errorf("%d driver calls for bad input, want none", n)
			}
			if _, err := dlock.New(&grantDriver{}, &tc.o); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("New with them as defaults: got %v, want ErrInvalid", err)
			}
		})
	}
	// Equal to the TTL is the shortest MaxHold; a defaults' HeartbeatTimeout
	// is fine with a refreshing lease.
	l, err := dlock.New(&grantDriver{}, &dlock.Options{HeartbeatTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	ls, err := l.TryAcquire(ctx, "x", &dlock.Options{TTL: time.Second, MaxHold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = ls.Release(ctx)
}

// Heartbeat allocates nothing: it is meant for a hot loop.
func TestHeartbeatAllocates(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.New(&grantDriver{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	ls, err := l.TryAcquire(ctx, "x", &dlock.Options{HeartbeatTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(ctx)
	if n := testing.AllocsPerRun(1000, ls.Heartbeat); n != 0 {
		t.Errorf("Heartbeat allocates %v times a call, want 0", n)
	}
}

func BenchmarkHeartbeat(b *testing.B) {
	ctx := context.Background()
	l, err := dlock.New(&grantDriver{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	ls, err := l.TryAcquire(ctx, "x", &dlock.Options{HeartbeatTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer ls.Release(ctx)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ls.Heartbeat()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ls.Heartbeat()
			}
		})
	})
}
