package redlock_test

import (
	"errors"
	"github.com/dlock/dlock/tests/internal/testutil"
	"testing"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/redlock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
)

// A dlock lock and a redsync mutex over the same nodes exclude each other
// both ways, so that a team can move from redsync to dlock (or back) one
// process at a time: in the compat layout with the same name, and in the
// default layout with the redsync mutex named after dlock's key.
func TestRedsyncInterop(t *testing.T) {
	c := newCluster(t, 3, nil)
	pools := make([]redsyncredis.Pool, len(c.raws))
	for i, r := range c.raws {
		pools[i] = redsyncgoredis.NewPool(r)
	}
	rs := redsync.New(pools...)
	for _, tc := range []struct {
		layout string
		opts   *redlock.Options
		mutex  func(name string) string
	}{
		{"compat", &redlock.Options{Compat: true}, func(name string) string { return name }},
		{"default", nil, lockKey},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			ctx := testutil.Ctx(t)
			l := newLocker(t, c.clients(t), tc.opts)
			name := "interop-" + testutil.RandomHex(4)
			// redsync bounds each node's call by expiry × its timeout factor,
			// 0.01 by default: 10ms for the 1s mutex below, which a loaded
			// machine's round trip exceeds (busy run 10: "node #0: context
			// deadline exceeded"). 0.25 gives each node a quarter of the
			// expiry.
			m := rs.NewMutex(tc.mutex(name), redsync.WithExpiry(5*time.Second), redsync.WithTries(1), redsync.WithTimeoutFactor(0.25))

			// dlock holds: redsync is refused, then gets it after the release.
			ls, err := l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.TryLockContext(ctx); err == nil {
				t.Fatal("redsync locked a mutex that dlock holds")
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m.TryLockContext(ctx); err != nil {
				t.Fatalf("redsync after dlock released: %v", err)
			}

			// redsync holds: dlock is refused, then gets it after the unlock.
			_, err = l.TryAcquire(ctx, name, nil)
			var busy *dlockdriver.BusyError
			if !errors.As(err, &busy) || busy.RetryAfter < 4*time.Second {
				t.Errorf("dlock TryAcquire while redsync holds: %v; want a BusyError with about 5s left", err)
			}
			if ok, err := m.UnlockContext(ctx); !ok || err != nil {
				t.Fatalf("redsync Unlock: %v, %v", ok, err)
			}
			ls, err = l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatalf("dlock after redsync unlocked: %v", err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// A dlock waiter behind a redsync lock, whose release announces
			// nothing, is granted when the lock's TTL has run out.
			short := rs.NewMutex(tc.mutex(name), redsync.WithExpiry(time.Second), redsync.WithTries(1), redsync.WithTimeoutFactor(0.25))
			if err := short.TryLockContext(ctx); err != nil {
				t.Fatal(err)
			}
			locked := time.Now()
			ls, err = l.Acquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			waited := time.Since(locked)
			t.Logf("dlock waiter granted %v after redsync locked with a 1s expiry", waited)
			// Not before the expiry (less redsync's drift, 1% + 2ms); the
			// upper bound is liveness, generous for a loaded machine.
			if waited < 900*time.Millisecond || waited > 3*time.Second {
				t.Errorf("granted after %v; want at the redsync lock's expiry (1s, within 2s after it)", waited)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
