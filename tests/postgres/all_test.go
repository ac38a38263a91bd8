package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/postgres"
	"github.com/dlock/dlock/tests/internal/testutil"
	"github.com/jackc/pgx/v5"
)

// allTracer counts the statements of acquire_all.sql a pool sends.
type allTracer struct{ n atomic.Int64 }

func (a *allTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "acquire_all.sql") {
		a.n.Add(1)
	}
	return ctx
}

func (a *allTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestTryAcquireAllOneStatement: TryAcquireAll takes every name in one
// statement, on one session (every key held by one backend); with a name
// held elsewhere it takes none, and the other names are free the moment it
// returns. Without shared sessions the names are taken one by one, each
// on a connection of its own.
func TestTryAcquireAllOneStatement(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	ctx := testutil.Ctx(t)
	tr := &allTracer{}
	cfg := poolConfig(t, addr)
	cfg.ConnConfig.Tracer = tr
	l, err := postgres.NewFromConfig(ctx, cfg, &postgres.Options{Defaults: dlock.Options{TTL: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	other := newLocker(t, addr, nil)
	raw := rawConn(t, addr)
	const k = 5
	names := make([]string, k)
	prefix := "all-" + testutil.RandomHex(4) + "-"
	for i := range names {
		names[i] = fmt.Sprintf("%s%02d", prefix, i)
	}

	ls, err := l.TryAcquireAll(ctx, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.n.Load(); n != 1 {
		t.Errorf("TryAcquireAll of %d names sent %d statements of acquire_all.sql; want 1", k, n)
	}
	pid := holderPID(t, raw, names[0])
	for _, n := range names[1:] {
		if p := holderPID(t, raw, n); p != pid {
			t.Errorf("%q held by backend %d, %q by %d: want one session for the lease", names[0], pid, n, p)
		}
	}
	fences, ok := ls.Fences()
	for i, f := range fences {
		if !ok || f == 0 || i > 0 && f == fences[i-1] {
			t.Errorf("fences %v (%v): want a distinct token per name", fences, ok)
			break
		}
	}
	for _, n := range names {
		if _, err := other.TryAcquire(ctx, n, nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) while TryAcquireAll holds it: %v; want ErrNotAcquired", n, err)
		}
	}
	release(t, ls)
	for _, n := range names {
		noResidue(t, raw, n)
	}

	held, err := other.TryAcquire(ctx, names[3], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquireAll(ctx, names, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with %q held: %v; want ErrNotAcquired", names[3], err)
	}
	if n := tr.n.Load(); n != 2 {
		t.Errorf("%d statements of acquire_all.sql after two TryAcquireAll calls; want 2", n)
	}
	for _, n := range names {
		if n == names[3] {
			continue
		}
		if left, err := kindEntries(ctx, raw, n); err != nil || len(left) != 0 {
			t.Errorf("after the busy TryAcquireAll, %q: %v (%v); want nothing held", n, left, err)
		}
	}
	release(t, held)

	// Without shared sessions: one by one, a connection each.
	solo := newLocker(t, addr, &postgres.Options{NoSharedSessions: true})
	ls, err = solo.TryAcquireAll(ctx, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int32]bool{}
	for _, n := range names {
		pids[holderPID(t, raw, n)] = true
	}
	if len(pids) != k {
		t.Errorf("without shared sessions, %d names held by %d backends; want %d", k, len(pids), k)
	}
	release(t, ls)
}

// BenchmarkTryAcquireAll times TryAcquireAll of k free names (one
// statement) against k TryAcquire calls one after another, the releases
// not timed.
func BenchmarkTryAcquireAll(b *testing.B) {
	addr := dlocktest.Require(b, dlocktest.Postgres).Addr()
	l := newLocker(b, addr, &postgres.Options{Defaults: dlock.Options{TTL: 5 * time.Second}})
	prefix := "all-bench-" + testutil.RandomHex(4) + "-"
	testutil.BenchTryAcquireAll(b, l, func(k int) []string {
		names := make([]string, k)
		for i := range names {
			names[i] = fmt.Sprintf("%sk%d-%02d", prefix, k, i)
		}
		return names
	})
}
