package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/fence/pgfence"
)

func pgConn(t *testing.T, ctx context.Context, addr string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, pgDSN(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// waitBlocked waits until the backend pid waits on a lock, as seen by c.
func waitBlocked(t *testing.T, ctx context.Context, c *pgx.Conn, pid uint32) {
	t.Helper()
	for {
		var waiting bool
		err := c.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&waiting)
		if err != nil {
			t.Fatalf("reading pg_stat_activity: %v", err)
		}
		if waiting {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %d never waited on a lock: %v", pid, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestPGCheckOrdersConcurrentWriters proves that Check takes effect with the
// transaction that made it: a second transaction checking the same resource
// waits for the first to end, then is refused when the first committed a
// higher fence, accepted when the first committed a lower one, and judged
// against the old fence when the first rolled back.
func TestPGCheckOrdersConcurrentWriters(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	addr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	g, err := pgfence.New("fence_guard_order")
	if err != nil {
		t.Fatal(err)
	}
	a, b, watch := pgConn(t, ctx, addr), pgConn(t, ctx, addr), pgConn(t, ctx, addr)
	if err := g.CreateTable(ctx, a); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		first, second uint64
		commit        bool
		wantStale     bool
		wantHighest   uint64
	}{
		{"higher committed first", 6, 5, true, true, 6},
		{"lower committed first", 5, 6, true, false, 6},
		{"higher rolled back", 6, 5, false, false, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resource := unique(t)
			if err := g.Check(ctx, a, resource, 1); err != nil { // a fence below both, committed
				t.Fatal(err)
			}
			txA, err := a.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer txA.Rollback(ctx)
			if err := g.Check(ctx, txA, resource, tc.first); err != nil {
				t.Fatalf("first check: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				done <- pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return g.Check(ctx, tx, resource, tc.second) })
			}()
			waitBlocked(t, ctx, watch, b.PgConn().PID())
			if tc.commit {
				err = txA.Commit(ctx)
			} else {
				err = txA.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-done
			var stale *fence.StaleError
			switch {
			case tc.wantStale && (!errors.As(err, &stale) || stale.Highest != tc.first):
				t.Errorf("second check: got %v, want a StaleError naming fence %d", err, tc.first)
			case !tc.wantStale && err != nil:
				t.Errorf("second check: got %v, want accepted", err)
			}
			if h, ok, err := g.Highest(ctx, watch, resource); err != nil || !ok || h != tc.wantHighest {
				t.Errorf("Highest = %d, %v, %v; want %d", h, ok, err, tc.wantHighest)
			}
		})
	}
}

// TestPGCheckInputAndSQL covers input refused before I/O, quoting, an equal
// fence, fences past 2^63, and CheckSQL in a database/sql transaction.
func TestPGCheckInputAndSQL(t *testing.T) {
	if _, err := pgfence.New("app..fences"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf(`New("app..fences"): got %v, want ErrInvalid`, err)
	}
	g, err := pgfence.New(`odd "name"`)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.DDL(); !contains(got, `"odd ""name"""`) {
		t.Errorf("DDL does not quote the table name: %s", got)
	}
	if err := g.Check(t.Context(), nil, "", 1); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("empty resource: got %v, want ErrInvalid before any I/O", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := pgConn(t, ctx, dlocktest.Require(t, dlocktest.Postgres).Addr())
	if err := g.CreateTable(ctx, c); err != nil {
		t.Fatal(err)
	}
	resource := unique(t)
	for _, f := range []uint64{3, 3, 1 << 63} {
		if err := g.Check(ctx, c, resource, f); err != nil {
			t.Errorf("fence %d: %v, want accepted", f, err)
		}
	}
	if err := g.Check(ctx, c, resource, 1<<63-1); !errors.Is(err, fence.ErrStale) {
		t.Errorf("fence 2^63-1 after 2^63: got %v, want ErrStale", err)
	}

	db, err := sql.Open("pgx", pgDSN(dlocktest.Require(t, dlocktest.Postgres).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, w := range []struct {
		token uint64
		stale bool
	}{{1 << 63, false}, {1<<63 + 1, false}, {5, true}} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = g.CheckSQL(ctx, tx, resource, w.token)
		if got := errors.Is(err, fence.ErrStale); got != w.stale || (!w.stale && err != nil) {
			t.Errorf("CheckSQL(fence %d): got %v, want stale %v", w.token, err, w.stale)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if h, _, err := g.Highest(ctx, c, resource); err != nil || h != 1<<63+1 {
		t.Errorf("Highest after CheckSQL = %d, %v; want %d", h, err, uint64(1<<63+1))
	}
}

// TestTokenWithoutFencing proves that a lease from a Locker with fencing off
// is refused by fence.Token rather than passed on as fence 0.
func TestTokenWithoutFencing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, pgDSN(dlocktest.Require(t, dlocktest.Postgres).Addr())+"&fencing=false")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ls, err := l.Acquire(ctx, unique(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(context.Background())
	if _, err := fence.Token(ls); !errors.Is(err, fence.ErrNoFence) {
		t.Errorf("got %v, want ErrNoFence", err)
	}
}
