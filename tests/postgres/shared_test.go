package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
)

// openShared opens a Locker with shared sessions on addr, with params added
// to the URL, closed at cleanup.
func openShared(t *testing.T, ctx context.Context, addr, params string) *dlock.Locker {
	t.Helper()
	l, err := dlock.Open(ctx, dsn(addr)+"&shared_sessions=true"+params)
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	return l
}

// Leases stack on shared sessions: 40 leases of two TTLs (two TTL classes,
// so at least two sessions) held by a few backends; pg_terminate_backend of
// one of them loses exactly the leases whose locks it held, each reporting
// the loss promptly, while every other lease is still held and refreshed.
func TestSharedSessionEndLosesExactlyItsLeases(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "")
	prefix := "shared-end-" + rand.Text()[:8] + "-"
	const n = 40
	leases := make([]*dlock.Lease, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		ttl := 3 * time.Second
		if i%2 == 1 {
			ttl = 4 * time.Second
		}
		wg.Go(func() {
			ls, err := l.Acquire(ctx, fmt.Sprintf("%s%d", prefix, i), &dlock.Options{TTL: ttl})
			if err != nil {
				errs <- err
				return
			}
			leases[i] = ls
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	raw := rawConn(t, addr)
	byPID := make(map[int32][]int)
	for i := range n {
		pid := holderPID(t, raw, fmt.Sprintf("%s%d", prefix, i))
		byPID[pid] = append(byPID[pid], i)
	}
	if len(byPID) < 2 || len(byPID) > 8 {
		t.Fatalf("%d leases on %d backends, want 2 to 8 (4 sessions per TTL)", n, len(byPID))
	}
	var victim int32
	for pid, idx := range byPID {
		if len(idx) > 1 { // a session holding several leases
			victim = pid
			break
		}
	}
	if victim == 0 {
		t.Fatalf("no backend holds more than one lease: %v", byPID)
	}
	onVictim := make(map[int]bool)
	for _, i := range byPID[victim] {
		onVictim[i] = true
	}
	var ok bool
	killed := time.Now()
	if err := raw.QueryRow(ctx, "SELECT pg_terminate_backend($1)", victim).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", victim, ok, err)
	}
	for _, i := range byPID[victim] {
		select {
		case <-leases[i].Done():
		case <-time.After(3 * time.Second):
			t.Fatalf("lease %d, on the terminated backend, reported no loss within 3s", i)
		}
		if !errors.Is(leases[i].Err(), dlock.ErrLost) {
			t.Errorf("lease %d: Err() = %v, want ErrLost", i, leases[i].Err())
		}
	}
	t.Logf("%d of %d leases on the terminated backend %d, all reported lost within %v", len(onVictim), n, victim, time.Since(killed))
	// The others outlive a TTL and more: refreshed, held on the server.
	time.Sleep(5 * time.Second)
	for i, ls := range leases {
		if onVictim[i] {
			continue
		}
		select {
		case <-ls.Done():
			t.Fatalf("lease %d, not on the terminated backend, ended: %v", i, ls.Err())
		default:
		}
		if held, err := ls.Held(ctx); err != nil || !held {
			t.Fatalf("lease %d: Held = %v, %v; want held", i, held, err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatalf("release of lease %d: %v", i, err)
		}
	}
	for i := range n {
		if left, err := lockEntries(ctx, raw, fmt.Sprintf("%s%d", prefix, i)); err != nil || len(left) != 0 {
			t.Fatalf("after the releases, lock %d: %v, %v", i, left, err)
		}
	}
}

// The waiting connections are bounded by wait_conns: with the one allowed
// in use by a waiting Acquire, another Acquire of a busy lock fails at once
// with ErrResourceLimit naming wait_conns (not waiting until its ctx ends),
// and succeeds once the first wait is over and its lease released.
func TestSharedWaitConnsBounded(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	a := openShared(t, ctx, addr, "")
	b := openShared(t, ctx, addr, "&wait_conns=1")
	prefix := "shared-waits-" + rand.Text()[:8] + "-"
	x, y := prefix+"x", prefix+"y"
	lx, err := a.Acquire(ctx, x, nil)
	if err != nil {
		t.Fatal(err)
	}
	ly, err := a.Acquire(ctx, y, nil)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan *dlock.Lease, 1)
	go func() {
		ls, err := b.Acquire(ctx, x, nil)
		if err != nil {
			t.Errorf("waiter of x: %v", err)
		}
		waited <- ls
	}()
	raw := rawConn(t, addr)
	waitLockEntries(t, ctx, raw, x, 2, (chan *dlock.Lease)(nil), "b's wait for x") // until b's wait for x is queued on the server
	start := time.Now()
	_, err = b.Acquire(ctx, y, nil) // ctx lasts a minute
	if took := time.Since(start); !errors.Is(err, dlock.ErrResourceLimit) || !errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "wait_conns") || took > time.Second {
		t.Fatalf("Acquire beyond wait_conns: %v after %v; want ErrResourceLimit naming wait_conns, at once", err, took)
	}
	if err := lx.Release(ctx); err != nil {
		t.Fatal(err)
	}
	bx := <-waited
	if bx == nil {
		t.FailNow()
	}
	if err := bx.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiting connection is free again: a wait for y queues, and is
	// granted on y's release.
	got := make(chan error, 1)
	go func() {
		ls, err := b.Acquire(ctx, y, nil)
		if err == nil {
			err = ls.Release(ctx)
		}
		got <- err
	}()
	waitLockEntries(t, ctx, raw, y, 2, got, "b's second wait ended before y was released")
	if err := ly.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("wait for y once the waiting connection was free: %v", err)
	}
}

// A Locker holding many leases on shared sessions uses few connections:
// 500 leases of one TTL on at most shared_conns (4) backends.
func TestSharedSessionsFewConnections(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "")
	prefix := "shared-few-" + rand.Text()[:8] + "-"
	const n = 500
	leases := make([]*dlock.Lease, n)
	var wg sync.WaitGroup
	var failed sync.Once
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				ls, err := l.TryAcquire(ctx, fmt.Sprintf("%s%d", prefix, i), nil)
				if err != nil {
					failed.Do(func() { t.Errorf("TryAcquire %d: %v", i, err) })
					return
				}
				leases[i] = ls
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var pids int
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	err := rawConn(t, addr).QueryRow(ctx, `SELECT count(DISTINCT l.pid) FROM pg_locks l, unnest($1::text[]) k
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND l.classid = ((hashtextextended(k, 0) >> 32) & 4294967295)::oid
		  AND l.objid = (hashtextextended(k, 0) & 4294967295)::oid`, names).Scan(&pids)
	if err != nil {
		t.Fatal(err)
	}
	if pids < 1 || pids > 4 {
		t.Fatalf("%d leases held by %d backends, want 1 to 4", n, pids)
	}
	t.Logf("%d leases on %d backends", n, pids)
	for _, ls := range leases {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A Locker never holds one name twice on a shared session (a session's
// advisory locks stack): a second TryAcquire of a name it holds is busy, a
// second Acquire waits (on a connection of its own) until the first lease
// is released, and is then granted.
func TestSharedSameNameTwice(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "")
	name := "shared-twice-" + rand.Text()[:8]
	first, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire of a held name: %v, want ErrNotAcquired", err)
	}
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, nil)
		if err == nil {
			err = ls.Release(ctx)
		}
		got <- err
	}()
	raw := rawConn(t, addr)
	// The second Acquire queued on the server, behind the first lease.
	waitLockEntries(t, ctx, raw, name, 2, got, "second Acquire ended while the first lease held the name")
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("second Acquire after the release: %v", err)
	}
}

// A lease left unrefreshed on a shared session that other leases keep
// alive is unlocked by the driver once its own TTL has passed, never
// before its ValidUntil, and reported lost; its neighbour holds on. Its TTL
// was shortened by a refresh (6s to 1s), so a sweep that still went by the
// TTL of the acquisition would free it about 5s late.
func TestSharedUnrefreshedLeaseExpires(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "&shared_conns=1")
	prefix := "shared-unrefreshed-" + rand.Text()[:8] + "-"
	keeper, err := l.TryAcquire(ctx, prefix+"keeper", &dlock.Options{TTL: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	left, err := l.TryAcquire(ctx, prefix+"left", &dlock.Options{TTL: 6 * time.Second, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, addr)
	if a, b := holderPID(t, raw, prefix+"keeper"), holderPID(t, raw, prefix+"left"); a != b {
		t.Fatalf("the leases are on backends %d and %d, want one (shared_conns=1)", a, b)
	}
	if err := left.Refresh(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	refreshed := time.Now()
	validUntil := left.ValidUntil()
	lost := lostWithin(t, left, 3*time.Second)
	if lost.Before(validUntil) {
		t.Fatalf("lease reported lost %v before its ValidUntil", validUntil.Sub(lost))
	}
	waitEntries(t, raw, prefix+"left", 3*time.Second-time.Since(refreshed))
	t.Logf("unrefreshed lease lost %v and freed on the server %v after its refresh to 1s", lost.Sub(refreshed), time.Since(refreshed))
	if held, err := keeper.Held(ctx); err != nil || !held {
		t.Fatalf("keeper: Held = %v, %v; want held", held, err)
	}
	if err := keeper.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Semaphore permits keep a connection each with shared sessions on (a
// permit's slot lock is re-entrant on its session, so permits cannot
// stack): asked for 1,000 permits of a semaphore of limit 1,000, a Locker
// whose pool has 8 connections grants at most 8 (fewer: its shared session
// has one), then fails at once with ErrResourceLimit naming pool_max_conns,
// not waiting for its ctx; locks keep being granted on the shared session
// meanwhile, and a permit's release makes room again.
func TestSharedPermitsBoundedByPool(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "&pool_max_conns=8")
	prefix := "shared-permits-" + rand.Text()[:8] + "-"
	lock, err := l.TryAcquire(ctx, prefix+"lock", nil) // the shared session
	if err != nil {
		t.Fatal(err)
	}
	sem, err := l.Semaphore(prefix+"sem", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var permits []*dlock.Lease
	var limitErr error
	for range 1000 {
		start := time.Now()
		p, err := sem.TryAcquire(ctx, nil)
		if err != nil {
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the failed permit took %v", took)
			}
			limitErr = err
			break
		}
		permits = append(permits, p)
	}
	if !errors.Is(limitErr, dlock.ErrResourceLimit) || !strings.Contains(fmt.Sprint(limitErr), "pool_max_conns") {
		t.Fatalf("after %d permits: %v; want ErrResourceLimit naming pool_max_conns", len(permits), limitErr)
	}
	if len(permits) < 1 || len(permits) > 7 {
		t.Fatalf("%d permits granted on a pool of 8 with a shared session, want 1 to 7", len(permits))
	}
	t.Logf("%d permits, then: %v", len(permits), limitErr)
	more, err := l.TryAcquire(ctx, prefix+"lock2", nil) // on the shared session: no connection needed
	if err != nil {
		t.Fatalf("a lock with the pool full of permits: %v", err)
	}
	if err := permits[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := sem.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("a permit after one was released: %v", err)
	}
	for _, ls := range append(permits[1:], p, lock, more) {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// An Acquire of a name that the Locker's last Acquire of it found held
// elsewhere waits at once on a connection of its own, without a try on the
// shared session first (whose last statement stays as it was), and is
// granted in turn.
func TestSharedBusyNameWaitsAtOnce(t *testing.T) {
	addr := servers.Require(t, servers.Postgres).Addr()
	ctx := testCtx(t)
	l := openShared(t, ctx, addr, "&shared_conns=1")
	prefix := "shared-busy-" + rand.Text()[:8] + "-"
	other, err := l.TryAcquire(ctx, prefix+"other", &dlock.Options{NoRefresh: true}) // the shared session
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, addr)
	shared := holderPID(t, raw, prefix+"other")
	lastStatement := func() time.Time {
		t.Helper()
		var at time.Time
		if err := raw.QueryRow(ctx, "SELECT query_start FROM pg_stat_activity WHERE pid = $1", shared).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	name := prefix + "busy"
	holder := rawConn(t, addr)
	for round := range 2 {
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", name); err != nil {
			t.Fatal(err)
		}
		before := lastStatement()
		got := acquireAsync(ctx, l, name, nil)
		waiting(t, raw, name, 1)
		tried := lastStatement().After(before)
		switch {
		case round == 0 && !tried:
			t.Fatal("the first Acquire of the busy name ran no statement on the shared session")
		case round == 1 && tried:
			t.Fatal("the second Acquire of the busy name tried on the shared session first")
		}
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", name); err != nil {
			t.Fatal(err)
		}
		r := granted(t, got, 10*time.Second)
		if pid := holderPID(t, raw, name); pid == shared {
			t.Fatalf("round %d: the lease waited for was granted on the shared session", round)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
