package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/redlock"
	"github.com/dlock/dlock/tests/internal/testutil"
)

// A refresh held up on the holder's path until around its lease's
// ValidUntil, long after the client gave up on it (each node's request is
// bounded by the node timeout), does not keep the lock for another TTL once
// the lease is declared lost: a waiter is granted within a short bound of
// the lost lease's ValidUntil (issue 29, item 9). Both arrivals extend the
// lock on every node unless the lost lease's lock is given up: just after
// the loss (within the drift margin, while the nodes still hold the token),
// and well before it (the nodes extend it; the client never hears).
func TestRefreshAfterDeclaredLossDoesNotExtend(t *testing.T) {
	const ttl = 5 * time.Second
	window := ttl/100 + 2*time.Millisecond // the default drift margin
	c := newCluster(t, 5, nil)
	for _, tc := range []struct {
		name   string
		arrive time.Duration // after ValidUntil
	}{
		{"after the loss", window / 2},
		{"before the loss", -ttl / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testutil.Ctx(t)
			ca, pa := c.proxied(t)
			o := &redlock.Options{NodeTimeout: 250 * time.Millisecond}
			o.Defaults = dlock.Options{TTL: ttl, NoRefresh: true}
			a := newLocker(t, ca, o)
			o.Defaults.NoRefresh = false
			b := newLocker(t, c.clients(t), o)
			name := "late-refresh-" + testutil.RandomHex(6)
			for _, l := range []*dlock.Locker{a, b} { // warm: connections dialled, scripts loaded
				ls, err := l.Acquire(ctx, name+"/warm", nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := ls.Refresh(ctx, 0); err != nil {
					t.Fatal(err)
				}
				if err := ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			ls, err := a.Acquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				ls  *dlock.Lease
				at  time.Time
				err error
			}
			waited := make(chan result, 1)
			go func() {
				lb, err := b.Acquire(ctx, name, nil)
				waited <- result{lb, time.Now(), err}
			}()

			// The refresh reaches the nodes tc.arrive after ValidUntil. The
			// client gives up on it at the node timeout; by then its
			// requests are inside the proxies, and the path heals for
			// everything sent after.
			vu := ls.ValidUntil()
			pa.SetLatency(time.Until(vu) + tc.arrive)
			err = ls.Refresh(ctx, 0)
			pa.SetLatency(0)
			if err == nil {
				t.Fatal("the refresh held up past the node timeout returned nil")
			}
			<-ls.Done()
			if !errors.Is(ls.Err(), dlock.ErrLost) {
				t.Fatalf("the lease ended with %v, want ErrLost", ls.Err())
			}

			r := <-waited
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			defer func() { _ = r.ls.Release(ctx) }()
			// Without the fix the waiter waits most of a TTL; the hand-off
			// over five nodes takes tens of ms, several times that on a
			// loaded machine.
			bound, err := conformance.Live(ttl / 10)
			if err != nil {
				t.Fatal(err)
			}
			late := r.at.Sub(vu)
			t.Logf("the waiter was granted %v after the lost lease's ValidUntil", late.Round(time.Millisecond))
			if late > bound {
				t.Errorf("the waiter was granted %v after the lost lease's ValidUntil, want within %v: the late refresh extended the lost lease", late.Round(time.Millisecond), bound)
			}
		})
	}
}
