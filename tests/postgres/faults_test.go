package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
)

// pg_terminate_backend of the holder's backend: the lease reports the loss
// at once (its idle connection is watched), long before its next refresh
// would, and the waiter is granted with a higher fencing token.
func TestTerminateBackend(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	ls, err := a.Acquire(ctx, name, &dlock.Options{TTL: 30 * time.Second}) // refreshes every 10s
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(ctx, b, name, nil)
	waiting(t, raw, name, 1)
	time.Sleep(100 * time.Millisecond) // past the holder's watch delay
	pid := holderPID(t, raw, name)
	var ok bool
	killed := time.Now()
	if err := raw.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	if d := lostWithin(t, ls, 5*time.Second).Sub(killed); d > time.Second {
		t.Errorf("loss reported %v after the backend was terminated, want promptly", d)
	}
	r := granted(t, w, 5*time.Second)
	if f0, f1 := fence(t, ls), fence(t, r.ls); f1 <= f0 {
		t.Errorf("waiter's fence %d does not exceed the terminated holder's %d", f1, f0)
	}
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of the terminated lease: got %v, want ErrNotHeld", err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The locker whose connection was killed works on.
	ls2, err := a.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("TryAcquire after the termination: %v", err)
	}
	if err := ls2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The server enforces expiry through idle_session_timeout: a holder that
// stops talking to the server (black-holed, so that its client can close
// nothing) loses its lock when its session has been idle for the TTL: not
// before the holder's ValidUntil, and within ExpirySlack (plus scheduling
// tolerance) after it. The lease's loss signal comes first.
func TestIdleSessionTimeout(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	p := proxied(t, srv.Addr())
	ttl := time.Second
	a := newLocker(t, p.Addr(), &postgres.Options{Defaults: dlock.Options{TTL: ttl}})
	name := uniqueName(t)
	ls, err := a.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := holderPID(t, raw, name)
	p.Blackhole()
	defer p.Heal()
	lostAt := lostWithin(t, ls, 2*ttl)
	until := ls.ValidUntil()
	if lostAt.Before(until) {
		t.Errorf("loss signalled %v before ValidUntil", until.Sub(lostAt))
	}
	// The session ends on the server, by its idle timeout (the client can
	// neither refresh nor close anything through the black hole).
	var gone time.Time
	for deadline := until.Add(postgres.ExpirySlack + 500*time.Millisecond); ; {
		var n int
		if err := raw.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			gone = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder's backend %d still runs %v after ValidUntil", pid, time.Since(until))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if gone.Before(until) {
		t.Errorf("the server ended the session %v before the holder's ValidUntil", until.Sub(gone))
	}
	t.Logf("session ended %v after ValidUntil (ExpirySlack %v)", gone.Sub(until), postgres.ExpirySlack)
	waitEntries(t, raw, name, time.Second)
}

// Restarting the server (a crash: SIGKILL) ends every session: every lease
// reports loss, a waiter queues again once the server is back and is granted,
// and fencing tokens taken after the restart exceed every one from before.
func TestServerRestart(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.RequireNew(t, servers.Postgres)
	l := newLocker(t, srv.Addr(), nil)
	w := newLocker(t, srv.Addr(), nil)
	names := []string{uniqueName(t), uniqueName(t), uniqueName(t)}
	var leases []*dlock.Lease
	var top uint64
	for _, n := range names {
		ls, err := l.TryAcquire(ctx, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		top = max(top, fence(t, ls))
		leases = append(leases, ls)
	}
	// Tokens handed out just before the crash: the sequence's WAL record for
	// some of them may not have reached the disk.
	for range 50 {
		ls, err := w.TryAcquire(ctx, names[1]+"/churn", nil)
		if err != nil {
			t.Fatal(err)
		}
		top = max(top, fence(t, ls))
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wait := acquireAsync(ctx, w, names[0], nil)
	waiting(t, rawConn(t, srv.Addr()), names[0], 1)

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ls := range leases {
		lostWithin(t, ls, 10*time.Second)
	}
	r := granted(t, wait, 30*time.Second)
	if f := fence(t, r.ls); f <= top {
		t.Errorf("fence %d after the restart does not exceed %d from before", f, top)
	}
	for _, n := range names[1:] {
		ls, err := l.TryAcquire(ctx, n, nil)
		if err != nil {
			t.Fatalf("TryAcquire after the restart: %v", err)
		}
		if f := fence(t, ls); f <= top {
			t.Errorf("fence %d after the restart does not exceed %d from before", f, top)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A ctx that ends in the middle of Refresh or Held does not drop the lock:
// the statement is cancelled on the server, the connection survives, and the
// lease holds on. (A Release cut short drops it, and says so.)
func TestCancelledCtxKeepsLock(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	p := proxied(t, srv.Addr())
	a := newLocker(t, p.Addr(), &postgres.Options{Defaults: dlock.Options{TTL: 10 * time.Second}})
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	ls, err := a.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := holderPID(t, raw, name)
	check := func(what string) {
		t.Helper()
		select {
		case <-ls.Done():
			t.Fatalf("after %s: lease ended: %v", what, ls.Err())
		default:
		}
		if got := holderPID(t, raw, name); got != pid {
			t.Fatalf("after %s: held by backend %d, want %d", what, got, pid)
		}
		if _, err := b.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("after %s: contender got %v, want ErrNotAcquired", what, err)
		}
	}
	// Already cancelled: nothing is sent.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := ls.Refresh(cancelled, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Refresh with a cancelled ctx: got %v, want context.Canceled", err)
	}
	if _, err := ls.Held(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Held with a cancelled ctx: got %v, want context.Canceled", err)
	}
	check("calls with a cancelled ctx")

	// Ending mid-statement: each request takes 100ms to arrive.
	p.SetLatency(100 * time.Millisecond)
	for i := range 3 {
		for _, op := range []string{"Refresh", "Held"} {
			tctx, cancel := context.WithTimeout(ctx, time.Duration(20+40*i)*time.Millisecond)
			if op == "Refresh" {
				err = ls.Refresh(tctx, 0)
			} else {
				_, err = ls.Held(tctx)
			}
			cancel()
			t.Logf("%s with a ctx ending mid-statement: %v", op, err)
			p.SetLatency(0)
			check(op + " cut short")
			p.SetLatency(100 * time.Millisecond)
		}
	}
	p.SetLatency(0)
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held = %v, %v; want true", ok, err)
	}

	// A statement that the server is still running when the ctx ends (held.sql
	// waits for a lock on pg_locks that another transaction holds) is
	// cancelled there: Held returns the ctx's error, the lease holds on.
	blocker := rawConn(t, srv.Addr())
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE pg_catalog.pg_locks IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	_, err = ls.Held(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Held blocked on the server past its ctx: got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Held returned %v after it started, want soon after its ctx ended (200ms)", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	check("Held cancelled on the server")
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held = %v, %v; want true", ok, err)
	}

	// Release cut short: the connection is closed, which frees the lock; the
	// lease reports loss, and a retried release says not held.
	p.SetLatency(100 * time.Millisecond)
	tctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	err = ls.Release(tctx)
	cancel()
	if err == nil {
		t.Fatal("Release returned nil though its ctx ended before the reply")
	}
	lostWithin(t, ls, time.Second)
	p.SetLatency(0)
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("retried Release: got %v, want ErrNotHeld", err)
	}
	waitEntries(t, raw, name, 2*time.Second)
}

// A cancelled wait leaves nothing in pg_locks by the time Acquire returns:
// the waiting backend left the queue.
func TestCancelledWaitLeavesQueue(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	ls, err := a.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := holderPID(t, raw, name)
	for range 5 {
		wctx, cancel := context.WithCancel(ctx)
		w := acquireAsync(wctx, b, name, nil)
		waiting(t, raw, name, 1)
		cancel()
		r := <-w
		if !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled wait: got %v", r.err)
		}
		got, err := lockEntries(ctx, raw, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != "pid "+itoa(pid)+" holds" {
			t.Fatalf("pg_locks right after the cancelled wait returned: %v, want only the holder", got)
		}
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The race between a grant and the wait's cancellation: whichever wins, no
// lock and no waiter is left once the dust settles, and a waiter that
// returned a lease holds it.
func TestGrantCancelRace(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	grants := 0
	for i := range 20 {
		ls, err := a.TryAcquire(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		w := acquireAsync(wctx, b, name, nil)
		waiting(t, raw, name, 1)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
			cancel()
		})
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		r := <-w
		if r.err == nil {
			grants++
			if ok, err := r.ls.Held(ctx); !ok || err != nil {
				t.Fatalf("a lease returned by the raced wait is not held: %v, %v", ok, err)
			}
			if err := r.ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		} else if !errors.Is(r.err, dlock.ErrNotAcquired) {
			t.Fatalf("raced wait: %v", r.err)
		}
		waitEntries(t, raw, name, 2*time.Second)
	}
	t.Logf("%d of 20 raced waits were granted", grants)
}

// Waiters are granted in the order they queued (the server's lock queue).
func TestFIFO(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	holder := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	ls, err := holder.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		l := newLocker(t, srv.Addr(), nil)
		wg.Go(func() {
			lw, err := l.Acquire(ctx, name, nil)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			if err := lw.Release(ctx); err != nil {
				t.Error(err)
			}
		})
		waiting(t, raw, name, i+1)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 0
	for i := range order {
		if i != want {
			t.Fatalf("waiter %d granted in place %d", i, want)
		}
		want++
	}
}
