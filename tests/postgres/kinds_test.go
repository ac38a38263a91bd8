package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/postgresexport"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// kindEntries lists the pg_locks rows of every key of name, in every kind's
// namespace (see the package doc, Layout), as "pid <pid> holds|waits
// <object>": the lock, the read/write lock, the semaphore's queue, its slots
// and its limits' keys.
func kindEntries(ctx context.Context, c *pgx.Conn, name string) ([]string, error) {
	rows, err := c.Query(ctx, `
		WITH k AS (SELECT hashtextextended($1, 0) AS lk, hashtextextended($1, 1) AS rw,
		                  hashtextextended($1, 2) AS q, hashtextextended($1, 3) AS s,
		                  hashtextextended($1, 4) AS l)
		SELECT l.pid, l.granted, l.mode,
		       CASE WHEN l.objsubid = 1 AND l.classid = ((k.lk >> 32) & 4294967295)::oid AND l.objid = (k.lk & 4294967295)::oid THEN 'lock'
		            WHEN l.objsubid = 1 AND l.classid = ((k.rw >> 32) & 4294967295)::oid AND l.objid = (k.rw & 4294967295)::oid THEN 'rwlock'
		            WHEN l.objsubid = 1 AND l.classid = ((k.q >> 32) & 4294967295)::oid AND l.objid = (k.q & 4294967295)::oid THEN 'queue'
		            WHEN l.objsubid = 2 AND l.classid = ((k.s >> 32) & 4294967295)::oid AND (l.objid::int8 >> 16) = ((k.s >> 16) & 65535) THEN 'slot ' || (l.objid::int8 & 65535)
		            WHEN l.objsubid = 2 AND l.classid = ((k.l >> 32) & 4294967295)::oid AND (l.objid::int8 >> 16) = ((k.l >> 16) & 65535) THEN 'limit ' || ((l.objid::int8 & 65535) + 1)
		       END AS what
		FROM pg_locks l, k
		WHERE l.locktype = 'advisory'
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY what, l.granted DESC, l.pid`, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var pid int32
		var granted bool
		var mode string
		var what *string
		if err := rows.Scan(&pid, &granted, &mode, &what); err != nil {
			return nil, err
		}
		if what == nil {
			continue
		}
		how := "waits"
		if granted {
			how = "holds"
		}
		left = append(left, fmt.Sprintf("pid %d %s %s (%s)", pid, how, *what, mode))
	}
	return left, rows.Err()
}

// metadataRows lists the rows of the metadata table (public schema) for
// name, as "metadata of pid <pid>: <metadata>"; none while the table does
// not exist.
func metadataRows(ctx context.Context, c *pgx.Conn, name string) ([]string, error) {
	rows, err := c.Query(ctx, `SELECT pid, metadata FROM dlock_metadata WHERE key = $1 ORDER BY pid`, name)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			return nil, nil
		}
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var pid int32
		var meta string
		if err := rows.Scan(&pid, &meta); err != nil {
			return nil, err
		}
		left = append(left, fmt.Sprintf("metadata of pid %d: %s", pid, meta))
	}
	return left, rows.Err()
}

// waitKind waits until name's entries satisfy ok.
func waitKind(t testing.TB, c *pgx.Conn, name string, what string, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := kindEntries(context.Background(), c, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_locks for %q: %v; want %s", name, got, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func count(entries []string, substr string) int {
	n := 0
	for _, e := range entries {
		if strings.Contains(e, substr) {
			n++
		}
	}
	return n
}

func noResidue(t testing.TB, c *pgx.Conn, name string) {
	t.Helper()
	waitKind(t, c, name, "nothing", func(e []string) bool { return len(e) == 0 })
}

// rlockAsync and lockAsync start a wait for a side of rw.
func rlockAsync(ctx context.Context, rw *dlock.RWLock) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := rw.RLock(ctx, nil)
		c <- result{ls, err, time.Now()}
	}()
	return c
}

func lockAsync(ctx context.Context, rw *dlock.RWLock) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := rw.Lock(ctx, nil)
		c <- result{ls, err, time.Now()}
	}()
	return c
}

func semAsync(ctx context.Context, s *dlock.Semaphore) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := s.Acquire(ctx, nil)
		c <- result{ls, err, time.Now()}
	}()
	return c
}

func pending(t testing.TB, c <-chan result, what string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s returned (%v, %v) while it should wait", what, r.ls, r.err)
	default:
	}
}

func release(t testing.TB, ls *dlock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ls.Release(ctx); err != nil {
		t.Fatalf("Release of %q: %v", ls.Name(), err)
	}
}

// Readers hold the read/write lock together and exclude a writer; a writer
// excludes readers and writers; each side is its own advisory key, apart
// from the lock of the same name; writers fence, readers do not.
func TestRWLockExclusion(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	rwa, err := a.RWLock(name)
	if err != nil {
		t.Fatal(err)
	}
	rwb, _ := b.RWLock(name)
	r1, err := rwa.TryRLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rwb.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, ok := r1.Fence(); ok {
		t.Errorf("a reader's lease has a fencing token")
	}
	if _, err := rwb.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside readers: got %v, want ErrNotAcquired", err)
	}
	// The lock of the same name is another object.
	lk, err := b.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("the lock of a read-locked name: %v", err)
	}
	got := waitKind(t, raw, name, "2 readers and the lock", func(e []string) bool { return len(e) == 3 })
	if count(got, "holds rwlock (ShareLock)") != 2 || count(got, "holds lock (ExclusiveLock)") != 1 {
		t.Errorf("pg_locks: %v, want two readers' ShareLocks and the lock", got)
	}
	release(t, r1)
	release(t, r2)
	w, err := rwb.TryLock(ctx, nil)
	if err != nil {
		t.Fatalf("TryLock once the readers left: %v", err)
	}
	f1 := fence(t, w)
	if _, err := rwa.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock beside a writer: got %v, want ErrNotAcquired", err)
	}
	if _, err := rwa.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside a writer: got %v, want ErrNotAcquired", err)
	}
	if ok, err := w.Held(ctx); err != nil || !ok {
		t.Fatalf("writer's Held: %v, %v", ok, err)
	}
	release(t, w)
	w2, err := rwa.TryLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f2 := fence(t, w2); f2 <= f1 {
		t.Errorf("writer's fence %d after %d, want it to increase", f2, f1)
	}
	release(t, w2)
	release(t, lk)
	noResidue(t, raw, name)
}

// Writer preference is PostgreSQL's own: a request that conflicts with a
// waiting one queues behind it, and a try fails. So once a writer waits, a
// new reader's TryRLock fails and its RLock queues behind the writer, while
// the reader already holding keeps its hold; the writer is granted when
// that reader leaves, the queued reader when the writer does.
func TestRWLockWriterPreference(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	c := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	rwa, _ := a.RWLock(name)
	rwb, _ := b.RWLock(name)
	rwc, _ := c.RWLock(name)
	r1, err := rwa.RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(ctx, rwb)
	waitKind(t, raw, name, "a waiting writer", func(e []string) bool { return count(e, "waits rwlock (ExclusiveLock)") == 1 })
	if _, err := rwc.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a writer waits: got %v, want ErrNotAcquired", err)
	}
	r2 := rlockAsync(ctx, rwc)
	waitKind(t, raw, name, "a reader queued behind the writer", func(e []string) bool { return count(e, "waits rwlock (ShareLock)") == 1 })
	if ok, err := r1.Held(ctx); err != nil || !ok {
		t.Fatalf("the holding reader's Held while a writer waits: %v, %v", ok, err)
	}
	pending(t, w, "Lock beside a reader")
	release(t, r1)
	wr := granted(t, w, 5*time.Second)
	pending(t, r2, "RLock behind the writer")
	release(t, wr.ls)
	rr := granted(t, r2, 5*time.Second)
	release(t, rr.ls)
	noResidue(t, raw, name)
}

// A writer whose wait is cut short leaves the queue, and the readers it kept
// out are granted at once.
func TestRWLockCancelledWriterLetsReadersIn(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	rwa, _ := a.RWLock(name)
	rwb, _ := b.RWLock(name)
	r1, err := rwa.RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := lockAsync(wctx, rwb)
	waitKind(t, raw, name, "a waiting writer", func(e []string) bool { return count(e, "waits rwlock") == 1 })
	r2 := rlockAsync(ctx, rwa)
	waitKind(t, raw, name, "a queued reader", func(e []string) bool { return count(e, "waits rwlock") == 2 })
	cancel()
	if r := <-w; !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Lock: got %v, %v", r.ls, r.err)
	}
	rr := granted(t, r2, 5*time.Second)
	release(t, rr.ls)
	release(t, r1)
	noResidue(t, raw, name)
}

// A semaphore hands out at most limit permits: slots of their own, apart
// from the lock and the read/write lock of the same name; a permit under
// another limit is refused with ErrLimitMismatch, taking nothing; permits
// fence; a release lets the next one in.
func TestSemaphoreLimit(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	sa, err := a.Semaphore(name, 3)
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := b.Semaphore(name, 3)
	var held []*dlock.Lease
	var last uint64
	for i := range 3 {
		s := sa
		if i%2 == 1 {
			s = sb
		}
		ls, err := s.TryAcquire(ctx, nil)
		if err != nil {
			t.Fatalf("permit %d: %v", i+1, err)
		}
		if f := fence(t, ls); f <= last {
			t.Errorf("permit %d's fence %d, after %d", i+1, f, last)
		} else {
			last = f
		}
		held = append(held, ls)
	}
	if _, err := sb.TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("a fourth permit of 3: got %v, want ErrNotAcquired", err)
	}
	lk, err := b.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("the lock of the semaphore's name: %v", err)
	}
	rw, _ := b.RWLock(name)
	wl, err := rw.TryLock(ctx, nil)
	if err != nil {
		t.Fatalf("the read/write lock of the semaphore's name: %v", err)
	}
	before, err := kindEntries(ctx, raw, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{2, 4} {
		other, _ := b.Semaphore(name, limit)
		_, err := other.TryAcquire(ctx, nil)
		if !errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "limit 3") {
			t.Errorf("TryAcquire with limit %d beside holders of 3: got %v, want ErrLimitMismatch naming 3", limit, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = other.Acquire(wctx, nil)
		cancel()
		if !errors.Is(err, dlock.ErrLimitMismatch) {
			t.Errorf("Acquire with limit %d beside holders of 3: got %v, want ErrLimitMismatch", limit, err)
		}
	}
	after := waitKind(t, raw, name, "what was there before the mismatches", func(e []string) bool { return slices.Equal(e, before) })
	if count(after, "holds slot") != 3 || count(after, "holds limit 3") != 3 {
		t.Errorf("pg_locks: %v, want 3 slots and 3 holds of limit 3", after)
	}
	for _, ls := range held {
		if ok, err := ls.Held(ctx); err != nil || !ok {
			t.Fatalf("permit's Held: %v, %v", ok, err)
		}
	}
	release(t, held[1])
	ls, err := sb.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("a permit once one was released: %v", err)
	}
	if f := fence(t, ls); f <= last {
		t.Errorf("fence %d after %d", f, last)
	}
	held[1] = ls
	for _, ls := range held {
		release(t, ls)
	}
	release(t, lk)
	release(t, wl)
	noResidue(t, raw, name)
	// Free again: any limit goes.
	s5, _ := a.Semaphore(name, 5)
	ls, err = s5.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("limit 5 once every permit of 3 was released: %v", err)
	}
	release(t, ls)
	noResidue(t, raw, name)
}

// Waiters for a permit queue in the server (the semaphore's queue key):
// the first is the head, listening for releases; each release is heard
// and hands the permit on at once (well within the head's backoff), in
// the order the waiters came.
func TestSemaphoreWaitersInOrder(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	sa, _ := a.Semaphore(name, 2)
	sb, _ := b.Semaphore(name, 2)
	opts := &dlock.Options{TTL: 30 * time.Second}
	h1, err := sa.TryAcquire(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := sa.TryAcquire(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var waits []<-chan result
	for i := range 3 {
		waits = append(waits, semAsync(ctx, sb))
		waitKind(t, raw, name, fmt.Sprintf("%d waiters", i+1), func(e []string) bool {
			return count(e, "queue") == i+1
		})
	}
	time.Sleep(1500 * time.Millisecond) // the head's backoff grows to its limit
	for i, w := range waits {
		pending(t, w, fmt.Sprintf("waiter %d", i+1))
	}
	// Each head was granted soon after the release (the backoff is 1s by
	// now; three grants within 250ms each are the notifications' doing).
	handOff := func(ls *dlock.Lease, w <-chan result, i int) result {
		t.Helper()
		released := time.Now()
		release(t, ls)
		r := granted(t, w, 5*time.Second)
		if d := r.at.Sub(released); d > 250*time.Millisecond {
			t.Errorf("waiter %d was granted %v after the release, want at once (notified)", i, d)
		}
		return r
	}
	r1 := handOff(h1, waits[0], 1)
	pending(t, waits[1], "waiter 2")
	r2 := handOff(h2, waits[1], 2)
	pending(t, waits[2], "waiter 3")
	time.Sleep(1500 * time.Millisecond) // the new head's backoff grows too
	r3 := handOff(r1.ls, waits[2], 3)
	release(t, r2.ls)
	release(t, r3.ls)
	noResidue(t, raw, name)
}

// A permit whose session ends (pg_terminate_backend) is reported lost, and
// its slot comes back to a waiter without a release to hear: the head looks
// again within its backoff.
func TestSemaphoreTerminatedHolder(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	sa, _ := a.Semaphore(name, 1)
	sb, _ := b.Semaphore(name, 1)
	ls, err := sa.TryAcquire(ctx, &dlock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := semAsync(ctx, sb)
	got := waitKind(t, raw, name, "a head waiting", func(e []string) bool { return count(e, "holds queue") == 1 })
	var pid int32
	for _, e := range got {
		if strings.Contains(e, "holds slot") {
			fmt.Sscanf(e, "pid %d", &pid)
		}
	}
	var ok bool
	if err := raw.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	lostWithin(t, ls, 5*time.Second)
	r := granted(t, w, 5*time.Second)
	release(t, r.ls)
	noResidue(t, raw, name)
}

// A wait for a permit cut short leaves nothing behind: not its place in the
// queue, nor a hold of the limit's key.
func TestSemaphoreCancelledWait(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	sa, _ := a.Semaphore(name, 1)
	sb, _ := b.Semaphore(name, 1)
	ls, err := sa.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, err := kindEntries(ctx, raw, name)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		wctx, cancel := context.WithCancel(ctx)
		w1, w2 := semAsync(wctx, sb), semAsync(wctx, sb)
		waitKind(t, raw, name, "a head and a queued waiter", func(e []string) bool { return count(e, "queue") == 2 })
		cancel()
		for _, w := range []<-chan result{w1, w2} {
			if r := <-w; !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled wait: got %v, %v", r.ls, r.err)
			}
		}
		waitKind(t, raw, name, "the holder alone", func(e []string) bool { return slices.Equal(e, before) })
	}
	release(t, ls)
	noResidue(t, raw, name)
}

// Leader election on PostgreSQL: the leader's candidate id, term (its
// fencing token) and grant time come from the metadata its session
// recorded; a resignation hands leadership to the waiting candidate, with
// a higher term; a terminated leader's row is no longer read, and the next
// leader's grant deletes it; nothing is left once the last leader resigned.
func TestElection(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	before := time.Now()
	la, err := a.Elect(ctx, name, "alpha", nil)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := b.Leader(ctx, name)
	switch {
	case err != nil:
		t.Fatal(err)
	case !ld.Held || ld.Candidate != "alpha" || ld.Term != fence(t, la):
		t.Fatalf("Leader: %+v, want alpha with term %d", ld, fence(t, la))
	case ld.Since.Before(before.Add(-time.Minute)) || ld.Since.After(time.Now().Add(time.Minute)):
		t.Errorf("Leader's Since %v, want about %v", ld.Since, before)
	}
	obs, err := b.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-obs; got.Candidate != "alpha" {
		t.Fatalf("Observe's first leader: %+v, want alpha", got)
	}
	wb := make(chan result, 1)
	go func() {
		ls, err := b.Elect(ctx, name, "beta", nil)
		wb <- result{ls, err, time.Now()}
	}()
	waiting(t, raw, name, 1)
	release(t, la)
	rb := granted(t, wb, 5*time.Second)
	for got := range obs {
		if got.Held && got.Candidate == "beta" {
			if got.Term <= fence(t, la) || got.Term != fence(t, rb.ls) {
				t.Errorf("beta's term %d, alpha's was %d, beta's lease has %d", got.Term, fence(t, la), fence(t, rb.ls))
			}
			break
		}
	}
	// beta's backend is terminated: it no longer leads, and its row is not
	// read as anyone's.
	pid := holderPID(t, raw, name)
	var ok bool
	if err := raw.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	lostWithin(t, rb.ls, 5*time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; {
		ld, err := a.Leader(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !ld.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Leader after the leader's backend ended: %+v, want nobody", ld)
		}
		time.Sleep(5 * time.Millisecond)
	}
	lg, err := a.Elect(ctx, name, "gamma", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rows, err := metadataRows(ctx, raw, name); err != nil || len(rows) != 1 || !strings.HasSuffix(rows[0], ": gamma") {
		t.Errorf("metadata rows once gamma leads: %v, %v; want gamma's alone", rows, err)
	}
	release(t, lg)
	noResidue(t, raw, name)
	if rows, err := metadataRows(ctx, raw, name); err != nil || len(rows) != 0 {
		t.Errorf("metadata rows after the last resignation: %v, %v", rows, err)
	}
}

// A connection kept from a lease with metadata (parked, see TestParkedConnection)
// carries none of it into the next lease of the same name.
func TestMetadataNotInherited(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	a := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	opts := &dlock.Options{TTL: 5 * time.Second, Metadata: "first"}
	ls, err := a.TryAcquire(ctx, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := a.Inspect(ctx, name)
	if err != nil || info.Metadata != "first" || !info.HasFence || info.Fence != fence(t, ls) {
		t.Fatalf("Inspect: %+v, %v; want metadata first and the lease's fence", info, err)
	}
	release(t, ls)
	ls, err = a.TryAcquire(ctx, name, &dlock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	info, err = a.Inspect(ctx, name)
	if err != nil || !info.Held || info.Metadata != "" || info.HasFence {
		t.Fatalf("Inspect of a lease without metadata: %+v, %v; want none", info, err)
	}
	release(t, ls)
}

// Askers under two limits at once never hold permits together: each takes
// its limit's key before it looks for another's, so of two that ask at the
// same moment at least one sees the other and is refused with
// ErrLimitMismatch, taking nothing. (A permit's interval as the client saw
// it lies within its hold on the server, so an overlap here is one there.)
func TestSemaphoreMismatchRace(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	name := uniqueName(t)
	type hold struct {
		limit    int
		from, to time.Time
	}
	const askers, rounds = 6, 25
	holds := make(chan hold, askers*rounds)
	errs := make(chan error, askers)
	for i := range askers {
		limit := 2 + i%2
		s, err := newLocker(t, srv.Addr(), nil).Semaphore(name, limit)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range rounds {
				ls, err := s.TryAcquire(ctx, nil)
				if errors.Is(err, dlock.ErrLimitMismatch) || errors.Is(err, dlock.ErrNotAcquired) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				from := time.Now()
				time.Sleep(time.Millisecond)
				to := time.Now()
				if err := ls.Release(ctx); err != nil {
					errs <- err
					return
				}
				holds <- hold{limit, from, to}
			}
			errs <- nil
		}()
	}
	for range askers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(holds)
	var all []hold
	granted := map[int]int{}
	for h := range holds {
		all = append(all, h)
		granted[h.limit]++
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.limit != b.limit && a.from.Before(b.to) && b.from.Before(a.to) {
				t.Fatalf("permits of limits %d and %d held together: %v–%v and %v–%v", a.limit, b.limit, a.from, a.to, b.from, b.to)
			}
		}
	}
	t.Logf("permits granted by limit: %v", granted)
	noResidue(t, raw, name)
}

// Every kind gives the application's pool its connections back as it found
// them: after permits (granted, busy, refused for their limit, a head's
// wait cut short), readers and writers, and an election watched by
// Observe, no connection is out of the pool, and none listens or has the
// lease's settings left.
func TestKindsConnectionsReturned(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	pool := appPool(t, srv.Addr(), "", 4)
	var idle, sync string
	if err := pool.QueryRow(ctx, "SELECT current_setting('idle_session_timeout'), current_setting('synchronous_commit')").Scan(&idle, &sync); err != nil {
		t.Fatal(err)
	}
	l, err := postgres.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	other := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)

	s, _ := l.Semaphore(name, 1)
	ls, err := s.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("busy permit: %v", err)
	}
	if s2, _ := l.Semaphore(name, 2); s2 != nil {
		if _, err := s2.TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrLimitMismatch) {
			t.Fatalf("other limit: %v", err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := s.Acquire(wctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait for a permit: got %v, want DeadlineExceeded", err)
	}
	cancel()
	release(t, ls)
	// A head granted after waiting.
	so, _ := other.Semaphore(name, 1)
	lo, err := so.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := semAsync(ctx, s)
	time.Sleep(20 * time.Millisecond)
	release(t, lo)
	release(t, granted(t, w, 5*time.Second).ls)

	rw, _ := l.RWLock(name)
	r, err := rw.RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	release(t, r)
	wl, err := rw.Lock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	release(t, wl)

	octx, ocancel := context.WithCancel(ctx)
	obs, err := l.Observe(octx, name)
	if err != nil {
		t.Fatal(err)
	}
	<-obs
	lead, err := l.Elect(ctx, name, "me", nil)
	if err != nil {
		t.Fatal(err)
	}
	for ld := range obs {
		if ld.Held && ld.Candidate == "me" {
			break
		}
	}
	release(t, lead)
	ocancel()
	for range obs {
	}

	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still out of the pool", pool.Stat().AcquiredConns())
		}
	}
	time.Sleep(250 * time.Millisecond) // parked connections go back
	conns := pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		var listening int
		var i, s string
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_listening_channels()").Scan(&listening)
		if err == nil {
			err = c.QueryRow(ctx, "SELECT current_setting('idle_session_timeout'), current_setting('synchronous_commit')").Scan(&i, &s)
		}
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
		if listening != 0 || i != idle || s != sync {
			t.Errorf("a connection back in the pool listens on %d channels, idle_session_timeout %s, synchronous_commit %s; want 0, %s, %s", listening, i, s, idle, sync)
		}
	}
	if len(conns) == 0 {
		t.Fatal("no idle connection to look at")
	}
}

// A notification that arrives while a statement runs comes just before its
// ReadyForQuery, and pgconn gives it to OnNotification alone: a head that
// looked with an ordinary statement would not hear a release made during
// its look. runListening reads it.
func TestRunListeningHearsNotificationDuringStatement(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	listener, notifier := rawConn(t, srv.Addr()), rawConn(t, srv.Addr())
	channel := fmt.Sprintf("dlock_test_%d", time.Now().UnixNano())
	if _, err := listener.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	const slow = "SELECT 1 FROM pg_sleep(0.3)"
	notifyDuring := func() chan error {
		done := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			_, err := notifier.Exec(ctx, "SELECT pg_notify($1, '')", channel)
			done <- err
		}()
		return done
	}
	// An ordinary statement: the notification is gone once it returns.
	done := notifyDuring()
	if _, err := listener.PgConn().ExecParams(ctx, slow, nil, nil, nil, nil).Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := listener.PgConn().WaitForNotification(wctx)
	cancel()
	if err == nil {
		t.Log("the notification of an ordinary statement was still there (pgconn kept it): runListening is not needed for it")
	}
	// runListening hears it.
	done = notifyDuring()
	notified, err := postgresexport.RunListening(ctx, listener.PgConn(), slow)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !notified {
		t.Fatal("runListening did not report the notification that came with its answer")
	}
}

// Readers and writers are connection-bound as locks are: the end of the
// holder's session (pg_terminate_backend) ends the hold on the server and
// is reported as the lease's loss within a second; a waiting writer is then
// granted.
func TestRWLockTerminatedHolders(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	rwa, _ := a.RWLock(name)
	rwb, _ := b.RWLock(name)
	terminate := func(what string) {
		t.Helper()
		got := waitKind(t, raw, name, what, func(e []string) bool { return count(e, what) == 1 })
		var pid int32
		for _, e := range got {
			if strings.Contains(e, what) {
				fmt.Sscanf(e, "pid %d", &pid)
			}
		}
		time.Sleep(100 * time.Millisecond) // past the holder's watch delay
		var ok bool
		if err := raw.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
	}
	r, err := rwa.RLock(ctx, &dlock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(ctx, rwb)
	waitKind(t, raw, name, "a waiting writer", func(e []string) bool { return count(e, "waits rwlock") == 1 })
	killed := time.Now()
	terminate("holds rwlock (ShareLock)")
	if d := lostWithin(t, r, 5*time.Second).Sub(killed); d > time.Second {
		t.Errorf("reader's loss reported %v after its backend was terminated", d)
	}
	wl := granted(t, w, 5*time.Second).ls
	killed = time.Now()
	terminate("holds rwlock (ExclusiveLock)")
	if d := lostWithin(t, wl, 5*time.Second).Sub(killed); d > time.Second {
		t.Errorf("writer's loss reported %v after its backend was terminated", d)
	}
	if err := wl.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of the terminated writer: got %v, want ErrNotHeld", err)
	}
	noResidue(t, raw, name)
}

// A head of a semaphore's queue whose network vanishes holds the queue key
// only until its session's idle_session_timeout (its TTL) ends the session:
// the waiters behind it are not stuck, the next becomes head and is granted
// the permit released meanwhile.
func TestSemaphoreBlackholedHead(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	p := proxied(t, srv.Addr())
	a := newLocker(t, srv.Addr(), nil)
	h := newLocker(t, p.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	sa, _ := a.Semaphore(name, 1)
	sh, _ := h.Semaphore(name, 1)
	sb, _ := b.Semaphore(name, 1)
	ls, err := sa.TryAcquire(ctx, &dlock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	hw := make(chan result, 1)
	go func() {
		ls, err := sh.Acquire(hctx, &dlock.Options{TTL: time.Second})
		hw <- result{ls, err, time.Now()}
	}()
	waitKind(t, raw, name, "a head", func(e []string) bool { return count(e, "holds queue") == 1 })
	w := semAsync(ctx, sb)
	waitKind(t, raw, name, "a waiter behind the head", func(e []string) bool { return count(e, "waits queue") == 1 })
	p.Blackhole()
	cut := time.Now()
	release(t, ls)
	r := granted(t, w, 10*time.Second)
	if d := r.at.Sub(cut); d > 3*time.Second {
		t.Errorf("the waiter behind a black-holed head was granted %v after the cut, want about the head's TTL (1s)", d)
	}
	release(t, r.ls)
	hcancel()
	p.Heal()
	<-hw
	noResidue(t, raw, name)
}
