package postgres_test

import (
	"crypto/rand"
	"errors"
	"github.com/dlock/dlock/tests/internal/testutil"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
)

// With a connection per lease (shared_sessions=false) and every connection
// of the pool holding a lease, an acquisition fails within about a second
// with ErrResourceLimit naming pool_max_conns and shared sessions, instead
// of waiting for a connection until its ctx ends; a release makes room
// again.
func TestPoolExhaustedFailsFast(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	ctx := testutil.Ctx(t)
	l, err := dlock.Open(ctx, dsn(addr)+"&pool_max_conns=2&shared_sessions=false")
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	prefix := "poolfull-" + rand.Text()[:8] + "-"
	a, err := l.Acquire(ctx, prefix+"a", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, prefix+"b", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, try := range []bool{true, false} {
		start := time.Now()
		var err error
		if try {
			_, err = l.TryAcquire(ctx, prefix+"c", nil)
		} else {
			_, err = l.Acquire(ctx, prefix+"c", nil) // ctx lasts a minute
		}
		took := time.Since(start)
		if !errors.Is(err, dlock.ErrResourceLimit) || !errors.Is(err, dlock.ErrNotAcquired) ||
			!strings.Contains(err.Error(), "pool_max_conns") || !strings.Contains(err.Error(), "shared_sessions=true") {
			t.Fatalf("try=%v with the pool full: %v; want ErrResourceLimit naming pool_max_conns and shared_sessions=true", try, err)
		}
		if took > 10*time.Second {
			t.Errorf("try=%v failed only after %v", try, took)
		}
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := l.TryAcquire(ctx, prefix+"c", nil)
	if err != nil {
		t.Fatalf("once a lease was released: %v", err)
	}
	for _, ls := range []*dlock.Lease{b, c} {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
