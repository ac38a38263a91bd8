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
	"github.com/dlock/dlock/dlocktest"
)

// manyLeases is how many leases TestDefaultURLHoldsManyLeases holds:
// DLOCK_PG_MANY_LEASES, or 10,000.
func manyLeases(t *testing.T) int {
	n := 10000
	if v := os.Getenv("DLOCK_PG_MANY_LEASES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("DLOCK_PG_MANY_LEASES=%q: want a whole number of at least 1", v)
		}
	}
	return n
}

// A Locker opened from a URL with no pool or shared-session parameter holds
// 10,000 leases at once on its pool of 32 connections (issue 30: one lease
// per connection ran out at 32): none fails with ErrResourceLimit, every
// one is refreshed by the watchdog and none is lost, they are held by at
// most 32 backends, and once they are released and the Locker closed no
// lock and no backend of theirs is left.
func TestDefaultURLHoldsManyLeases(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	n := manyLeases(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	l, err := dlock.Open(ctx, dsn(addr)) // the defaults: pool_max_conns 32, TTL 15s
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.Close(context.Background())
		}
	})
	prefix := "many-" + rand.Text()[:8] + "-"
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
	}

	start := time.Now()
	leases := make([]*dlock.Lease, n)
	var wg sync.WaitGroup
	var failed sync.Once
	const workers = 32
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				ls, err := l.TryAcquire(ctx, names[i], nil)
				if err != nil {
					failed.Do(func() { t.Errorf("TryAcquire %d of %d: %v", i, n, err) })
					return
				}
				leases[i] = ls
			}
		})
	}
	wg.Wait()
	acquired := time.Since(start)
	defer func() { // on failure, give back what was taken
		for _, ls := range leases {
			if ls != nil {
				_ = ls.Release(context.Background())
			}
		}
	}()
	if t.Failed() {
		t.FailNow()
	}

	raw := rawConn(t, addr)
	var held, pids int
	err = raw.QueryRow(ctx, `SELECT count(*), count(DISTINCT l.pid) FROM pg_locks l, unnest($1::text[]) k
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND l.classid = ((hashtextextended(k, 0) >> 32) & 4294967295)::oid
		  AND l.objid = (hashtextextended(k, 0) & 4294967295)::oid`, names).Scan(&held, &pids)
	if err != nil {
		t.Fatal(err)
	}
	if held != n || pids < 1 || pids > 32 {
		t.Fatalf("the server shows %d of %d locks held by %d backends, want all of them by 1 to 32", held, n, pids)
	}
	var backends []int32
	rows, err := raw.Query(ctx, `SELECT DISTINCT l.pid FROM pg_locks l, unnest($1::text[]) k
		WHERE l.locktype = 'advisory' AND l.objsubid = 1
		  AND l.classid = ((hashtextextended(k, 0) >> 32) & 4294967295)::oid
		  AND l.objid = (hashtextextended(k, 0) & 4294967295)::oid`, names)
	if err == nil {
		for rows.Next() {
			var pid int32
			if err = rows.Scan(&pid); err != nil {
				break
			}
			backends = append(backends, pid)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		t.Fatal(err)
	}

	// Every lease is refreshed (its ValidUntil moves), none is lost.
	first := make([]time.Time, n)
	for i, ls := range leases {
		first[i] = ls.ValidUntil()
	}
	refreshStart := time.Now()
	for i, ls := range leases {
		for !ls.ValidUntil().After(first[i]) {
			select {
			case <-ls.Done():
				t.Fatalf("lease %d of %d lost: %v", i, n, ls.Err())
			case <-ctx.Done():
				t.Fatalf("lease %d of %d not refreshed (ValidUntil %v) after %v", i, n, first[i], time.Since(refreshStart))
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	refreshed := time.Since(refreshStart)
	for i, ls := range leases {
		select {
		case <-ls.Done():
			t.Fatalf("lease %d of %d lost: %v", i, n, ls.Err())
		default:
		}
	}

	start = time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := leases[i].Release(ctx); err != nil {
					failed.Do(func() { t.Errorf("Release %d of %d: %v", i, n, err) })
					return
				}
				leases[i] = nil
			}
		})
	}
	wg.Wait()
	released := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}
	if err := raw.QueryRow(ctx, `SELECT count(*) FROM pg_locks l, unnest($1::text[]) k
		WHERE l.locktype = 'advisory' AND l.objsubid = 1
		  AND l.classid = ((hashtextextended(k, 0) >> 32) & 4294967295)::oid
		  AND l.objid = (hashtextextended(k, 0) & 4294967295)::oid`, names).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("%d lock entries left after every lease was released", held)
	}
	closed = true
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Close closed the pool: every backend that held a lease ends (the
	// server notices the Terminate message at once; polled, bounded by ctx).
	for {
		var left int
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, backends).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of the %d backends that held leases are still there after Close", left, len(backends))
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("%d leases on %d backends (pool of 32): acquired in %v, all refreshed within %v, released in %v",
		n, pids, acquired.Round(time.Millisecond), refreshed.Round(time.Millisecond), released.Round(time.Millisecond))
}

// A server's lock table bounds the leases of every session together
// (max_locks_per_transaction × (max_connections +
// max_prepared_transactions) entries and the server's slack, some 1,900
// here; some 12,700 on a server with the defaults): past it, TryAcquire and
// Acquire fail at once with ErrResourceLimit naming
// max_locks_per_transaction, rather than Acquire retrying the server's "out
// of shared memory" until its ctx ends.
func TestLockTableFullFailsFast(t *testing.T) {
	srv := dlocktest.RequireNewWith(t, dlocktest.Postgres, &dlocktest.StartOptions{
		Cmd: []string{"-c", "max_locks_per_transaction=10", "-c", "max_connections=50"},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	l, err := dlock.Open(ctx, dsn(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	var leases []*dlock.Lease
	defer func() {
		for _, ls := range leases {
			_ = ls.Release(context.Background())
		}
	}()
	prefix := "locktable-" + rand.Text()[:8] + "-"
	for i := 0; ; i++ {
		if i == 20000 {
			t.Fatalf("%d leases granted, and the lock table not full", i)
		}
		ls, err := l.TryAcquire(ctx, fmt.Sprintf("%s%d", prefix, i), nil)
		if err == nil {
			leases = append(leases, ls)
			continue
		}
		if !errors.Is(err, dlock.ErrResourceLimit) || !errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "max_locks_per_transaction") {
			t.Fatalf("TryAcquire %d: %v; want ErrResourceLimit naming max_locks_per_transaction", i, err)
		}
		t.Logf("the lock table is full at %d leases: %v", i, err)
		break
	}
	start := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	_, err = l.Acquire(wctx, prefix+"wait", nil)
	if !errors.Is(err, dlock.ErrResourceLimit) || wctx.Err() != nil {
		t.Fatalf("Acquire with the lock table full: %v after %v; want ErrResourceLimit at once", err, time.Since(start))
	}
	for _, ls := range leases {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	leases = nil
	ls, err := l.TryAcquire(ctx, prefix+"after", nil)
	if err != nil {
		t.Fatalf("TryAcquire once the leases were released: %v", err)
	}
	leases = append(leases, ls)
}
