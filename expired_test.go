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

// lateDriver grants every attempt, but its grants say they were sent a TTL
// ago: each arrives already expired, as when the round trip takes longer
// than the TTL.
type lateDriver struct {
	attempts, released atomic.Int32
}

func (d *lateDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *lateDriver) Close() error                     { return nil }

func (d *lateDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	d.attempts.Add(1)
	return &driver.Grant{Handle: lateHandle{d}, Sent: time.Now().Add(-req.TTL)}, nil
}

// lateWaiter is lateDriver with a server-side queue (driver.Waiter).
type lateWaiter struct{ *lateDriver }

func (d lateWaiter) Acquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	return d.TryAcquire(ctx, req)
}

type lateHandle struct{ d *lateDriver }

func (h lateHandle) Refresh(context.Context, time.Duration) (time.Duration, error) { return 0, nil }
func (h lateHandle) Held(context.Context) (bool, error)                            { return false, nil }
func (h lateHandle) Release(context.Context) error {
	h.d.released.Add(1)
	return nil
}

// A grant that arrives already expired is given back and reported with
// ErrGrantExpired, which does not read as "held by someone else"
// (ErrNotAcquired); Acquire keeps trying, with a backoff, until its ctx ends
// and then reports all three.
func TestGrantArrivedExpired(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(*lateDriver) driver.Driver
	}{
		{"polling", func(d *lateDriver) driver.Driver { return d }},
		{"queueing", func(d *lateDriver) driver.Driver { return lateWaiter{d} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := &lateDriver{}
			l, err := dlock.New(tc.new(d), &dlock.Options{TTL: time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(ctx)

			_, err = l.TryAcquire(ctx, "n", nil)
			if !errors.Is(err, dlock.ErrGrantExpired) || errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire with a grant that arrived expired: got %v, want ErrGrantExpired and not ErrNotAcquired", err)
			}
			if got := d.released.Load(); got != 1 {
				t.Fatalf("the expired grant was given back %d times, want 1", got)
			}

			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			before := d.attempts.Load()
			_, err = l.Acquire(wctx, "n", nil)
			if !errors.Is(err, dlock.ErrGrantExpired) || !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire ended by its ctx: got %v, want ErrNotAcquired, DeadlineExceeded and ErrGrantExpired", err)
			}
			// Tried again, but not in a hot loop: 200ms at 10..25ms apart.
			if n := d.attempts.Load() - before; n < 3 || n > 30 {
				t.Errorf("Acquire made %d attempts in 200ms with retry delays of 10..25ms, want 3..30", n)
			}
		})
	}
}

// A TTL that validation accepts can be granted: memory's MinTTL, on a free
// name, is granted (the drift margin, TTL/100 + 2ms, leaves it most of its
// validity).
func TestMemoryMinTTLGrantable(t *testing.T) {
	ctx := context.Background()
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	minTTL := l.Capabilities().MinTTL
	if _, err := l.TryAcquire(ctx, "n", &dlock.Options{TTL: minTTL - time.Nanosecond}); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TTL just below MinTTL %v: got %v, want ErrInvalid", minTTL, err)
	}
	var err2 error
	for range 5 { // a stalled process may miss the validity once in a while
		var ls *dlock.Lease
		ls, err2 = l.TryAcquire(ctx, "n", &dlock.Options{TTL: minTTL, NoRefresh: true})
		if err2 == nil {
			if err := ls.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatal(err)
			}
			return
		}
		if !errors.Is(err2, dlock.ErrGrantExpired) {
			t.Fatalf("TryAcquire with TTL = MinTTL %v on a free name: %v", minTTL, err2)
		}
	}
	t.Fatalf("TryAcquire with TTL = MinTTL %v on a free name failed 5 times: %v", minTTL, err2)
}

// TestTTLBelowDriftRejected: a TTL the drift margin would leave no validity
// for is ErrInvalid before any attempt, even on a driver declaring no
// minimum.
func TestTTLBelowDriftRejected(t *testing.T) {
	d := &lateDriver{}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond} {
		_, err := l.TryAcquire(context.Background(), "x", &dlock.Options{TTL: ttl})
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("TTL %v: got %v, want ErrInvalid", ttl, err)
		}
	}
	if n := d.attempts.Load(); n != 0 {
		t.Errorf("the driver saw %d attempts; want none", n)
	}
}
