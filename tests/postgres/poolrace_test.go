package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/dlocktest"
)

// live is the liveness bound d multiplied by DLOCK_TOLERANCE_SCALE.
func live(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	f := 1.0
	if v := os.Getenv(conformance.ToleranceScaleEnv); v != "" {
		var err error
		if f, err = strconv.ParseFloat(v, 64); err != nil || !(f > 0) {
			t.Fatalf("%s=%q is not a positive number", conformance.ToleranceScaleEnv, v)
		}
	}
	return time.Duration(float64(d) * f)
}

// Goroutines racing to fill a Locker's pool from empty: every Acquire
// either gets a lease or fails with ErrResourceLimit naming pool_max_conns
// within a few seconds of the pool being full, whatever the interleaving;
// none waits for its ctx, which lasts far longer. (A check of the pool before an unbounded wait for
// a connection let 13 of 16 such calls wait for their whole ctx.)
func TestPoolFillingRaceFailsFast(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	const maxConns = 32
	bound := live(t, 5*time.Second)
	for _, tc := range []struct {
		name       string
		goroutines int
		each       int // acquisitions per goroutine; 0: until one fails
	}{
		{"16 until full", 16, 0},
		{"64 once each", 2 * maxConns, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			// A connection per lease: by default, locks would share
			// sessions past half the pool and never fill it.
			l, err := dlock.Open(ctx, dsn(addr)+"&shared_sessions=false&pool_max_conns="+strconv.Itoa(maxConns))
			if err != nil {
				t.Fatal(err)
			}
			closeAtCleanup(t, l)
			prefix := "poolrace-" + rand.Text()[:8] + "-"
			type call struct {
				g, i       int
				start, end time.Time
				err        error
			}
			var (
				mu     sync.Mutex
				calls  []call
				leases []*dlock.Lease
			)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range tc.goroutines {
				wg.Go(func() {
					<-start
					for i := 0; tc.each == 0 || i < tc.each; i++ {
						// The test's ctx lasts far longer than the bound: a
						// call that waits for it shows as one past the bound.
						began := time.Now()
						ls, err := l.Acquire(ctx, fmt.Sprintf("%s%d-%d", prefix, g, i), nil)
						mu.Lock()
						calls = append(calls, call{g, i, began, time.Now(), err})
						if ls != nil {
							leases = append(leases, ls)
						}
						mu.Unlock()
						if err != nil {
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			// Filling the pool from empty takes a connection per lease,
			// seconds on a loaded machine: the bound runs from when the
			// pool was full (the last grant) or from the call, if later.
			var full time.Time
			for _, c := range calls {
				if c.err == nil && c.end.After(full) {
					full = c.end
				}
			}
			limits := 0
			for _, c := range calls {
				from := c.start
				if full.After(from) {
					from = full
				}
				switch took := c.end.Sub(from); {
				case c.err == nil:
				case took > bound:
					t.Errorf("goroutine %d call %d returned %v after the pool was full (bound %v): %v", c.g, c.i, took.Round(time.Millisecond), bound, c.err)
				case errors.Is(c.err, dlock.ErrResourceLimit) && errors.Is(c.err, dlock.ErrNotAcquired) && strings.Contains(c.err.Error(), "pool_max_conns"):
					limits++
				default:
					t.Errorf("goroutine %d call %d: %v; want a lease or ErrResourceLimit naming pool_max_conns", c.g, c.i, c.err)
				}
			}
			if len(leases) > maxConns || len(leases) == 0 {
				t.Errorf("%d leases granted on a pool of %d", len(leases), maxConns)
			}
			if limits == 0 {
				t.Errorf("no call failed with ErrResourceLimit (%d leases)", len(leases))
			}
			t.Logf("%d leases, %d ErrResourceLimit", len(leases), limits)
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer rcancel()
			for _, ls := range leases {
				if err := ls.Release(rctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
