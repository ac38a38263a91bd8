package postgres_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/postgresexport"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// dsn is the URL of the test server at addr.
func dsn(addr string) string {
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", servers.PostgresUser, servers.PostgresPassword, addr, servers.PostgresDatabase)
}

// poolConfig is a pool configuration for addr.
func poolConfig(t testing.TB, addr string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn(addr) + "&pool_max_conns=32")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// rawConn is a plain connection to addr, closed at cleanup.
func rawConn(t testing.TB, addr string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// waitLockEntries polls pg_locks until name's advisory key has n entries
// (holders and waiters queued on the server). It fails the test when ctx
// ends first, or when a value arrives on ended (a wait that should still be
// queued came back), naming what.
func waitLockEntries[T any](t *testing.T, ctx context.Context, c *pgx.Conn, name string, n int, ended <-chan T, what string) {
	t.Helper()
	for {
		entries, err := lockEntries(ctx, c, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %d entries of %q never queued: %v", what, n, name, entries)
		case v := <-ended:
			t.Fatalf("%s: %v", what, v)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lockEntries lists the pg_locks rows of name's advisory key, as
// "pid <pid> holds" or "pid <pid> waits".
func lockEntries(ctx context.Context, c *pgx.Conn, name string) ([]string, error) {
	rows, err := c.Query(ctx, `
		SELECT pid, granted FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
		  AND objid = (hashtextextended($1, 0) & 4294967295)::oid
		ORDER BY granted DESC, pid`, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var pid int32
		var granted bool
		if err := rows.Scan(&pid, &granted); err != nil {
			return nil, err
		}
		what := "waits"
		if granted {
			what = "holds"
		}
		left = append(left, fmt.Sprintf("pid %d %s", pid, what))
	}
	return left, rows.Err()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newLocker returns a Locker on addr with its own pool, closed at cleanup.
func newLocker(t testing.TB, addr string, opts *postgres.Options) *dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := postgres.NewFromConfig(ctx, poolConfig(t, addr), opts)
	if err != nil {
		t.Fatalf("NewFromConfig: %v", err)
	}
	closeAtCleanup(t, l)
	return l
}

func closeAtCleanup(t testing.TB, l *dlock.Locker) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// proxied returns a faultnet proxy in front of addr, closed at cleanup.
func proxied(t testing.TB, addr string) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

var nameSeq atomic.Int64

// uniqueName returns a lock name no other test uses.
func uniqueName(t testing.TB) string {
	return fmt.Sprintf("dlock-test/%s/%d-%d", t.Name(), time.Now().UnixNano(), nameSeq.Add(1))
}

// holderPID returns the backend pid that holds name, failing if none does.
func holderPID(t testing.TB, c *pgx.Conn, name string) int32 {
	t.Helper()
	var pid int32
	err := c.QueryRow(context.Background(), `
		SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		  AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
		  AND objid = (hashtextextended($1, 0) & 4294967295)::oid`, name).Scan(&pid)
	if err != nil {
		t.Fatalf("finding the holder of %q: %v", name, err)
	}
	return pid
}

// waitEntries waits up to limit until name's pg_locks entries are want.
func waitEntries(t testing.TB, c *pgx.Conn, name string, limit time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got, err := lockEntries(context.Background(), c, name)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, want) || len(got) == 0 && len(want) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_locks for %q: got %v, want %v", name, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waiting waits until n backends wait for name.
func waiting(t testing.TB, c *pgx.Conn, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := lockEntries(context.Background(), c, name)
		if err != nil {
			t.Fatal(err)
		}
		w := 0
		for _, e := range got {
			if strings.HasSuffix(e, "waits") {
				w++
			}
		}
		if w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_locks for %q: %v, want %d waiting", name, got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type result struct {
	ls  *dlock.Lease
	err error
	at  time.Time
}

// acquireAsync starts an Acquire and returns where its outcome arrives.
func acquireAsync(ctx context.Context, l *dlock.Locker, name string, o *dlock.Options) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, o)
		c <- result{ls, err, time.Now()}
	}()
	return c
}

// granted waits for a successful outcome.
func granted(t testing.TB, c <-chan result, limit time.Duration) result {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		return r
	case <-time.After(limit):
		t.Fatalf("Acquire not granted within %v", limit)
	}
	return result{}
}

// lostWithin waits for ls to end as lost.
func lostWithin(t testing.TB, ls *dlock.Lease, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-ls.Done():
		if !errors.Is(ls.Err(), dlock.ErrLost) {
			t.Fatalf("lease ended with %v, want ErrLost", ls.Err())
		}
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("lease %q not lost within %v", ls.Name(), limit)
	}
	return time.Time{}
}

func fence(t testing.TB, ls *dlock.Lease) uint64 {
	t.Helper()
	f, ok := ls.Fence()
	if !ok {
		t.Fatal("no fencing token")
	}
	return f
}

func itoa(n int32) string { return fmt.Sprint(n) }

// The shared sessions' keep-alive, a Sync message alone, restarts the
// session's idle_session_timeout as a statement does: a session with a 1s
// timeout sent one every 250ms outlives 3s and is usable after, and ends
// once they stop; on a terminated session it fails and closes the
// connection.
func TestKeepAlive(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	c := rawConn(t, srv.Addr())
	if _, err := c.Exec(ctx, "SET idle_session_timeout = 1000"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		if err := postgresexport.KeepAlive(ctx, c.PgConn()); err != nil {
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the connection after keep-alives: %v", err)
	}
	// They stop: the server ends the session 1s later.
	time.Sleep(2500 * time.Millisecond)
	if err := postgresexport.KeepAlive(ctx, c.PgConn()); err == nil || !c.PgConn().IsClosed() {
		t.Fatalf("keep-alive 2.5s after the last statement, on a session with a 1s idle_session_timeout: %v, connection closed %v; want an error and a closed connection", err, c.PgConn().IsClosed())
	}
}

// The fast-path release (a FunctionCall of pg_advisory_unlock(bigint) by its
// OID) unlocks the session's lock and leaves the connection usable; on a
// session that does not hold the lock it answers false; an exchange cut
// short by its ctx, or by the session's end, closes the connection.
func TestFastUnlock(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	var oid uint32
	if err := raw.QueryRow(ctx, "SELECT 'pg_advisory_unlock(bigint)'::regprocedure::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if oid != postgresexport.OIDAdvisoryUnlock {
		t.Fatalf("pg_advisory_unlock(bigint) has OID %d on the server, the driver calls %d", oid, postgresexport.OIDAdvisoryUnlock)
	}

	c := rawConn(t, srv.Addr())
	name := uniqueName(t)
	var key int64
	if err := c.QueryRow(ctx, "SELECT hashtextextended($1, 0) FROM pg_advisory_lock(hashtextextended($1, 0))", name).Scan(&key); err != nil {
		t.Fatal(err)
	}
	waitEntries(t, raw, name, 0, "pid "+itoa(int32(c.PgConn().PID()))+" holds")
	bkey := binary.BigEndian.AppendUint64(nil, uint64(key))
	if ok, err := postgresexport.FastUnlock(ctx, c.PgConn(), bkey); err != nil || !ok {
		t.Fatalf("fast-path unlock of a held lock: %v, %v; want true", ok, err)
	}
	waitEntries(t, raw, name, 0)
	if ok, err := postgresexport.FastUnlock(ctx, c.PgConn(), bkey); err != nil || ok {
		t.Fatalf("fast-path unlock of a lock not held: %v, %v; want false", ok, err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the connection after fast-path calls: %v", err)
	}

	// A ctx ended before: nothing is sent, the connection stays.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := postgresexport.FastUnlock(cancelled, c.PgConn(), bkey); !errors.Is(err, context.Canceled) || c.PgConn().IsClosed() {
		t.Fatalf("fast-path unlock with its ctx ended before: %v, connection closed %v; want context.Canceled and the connection open", err, c.PgConn().IsClosed())
	}
	// A ctx that ends while the server does not answer (black-holed): the
	// exchange is cut short and the connection closed.
	p := proxied(t, srv.Addr())
	c = rawConn(t, p.Addr())
	p.Blackhole()
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := postgresexport.FastUnlock(tctx, c.PgConn(), bkey); !errors.Is(err, context.DeadlineExceeded) || !c.PgConn().IsClosed() {
		t.Fatalf("fast-path unlock with its ctx ending unanswered: %v, connection closed %v; want context.DeadlineExceeded and a closed connection", err, c.PgConn().IsClosed())
	}
	if d := time.Since(start); d > 2*time.Second { // 200ms, plus up to closeTimeout (1s) for the close
		t.Errorf("the cut-short exchange took %v", d)
	}
	p.Heal()
	// A ctx that can end but does not: the answer comes, and the connection
	// is usable after (no deadline left on it).
	c = rawConn(t, srv.Addr())
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	if ok, err := postgresexport.FastUnlock(lctx, c.PgConn(), bkey); err != nil || !ok {
		t.Fatalf("fast-path unlock with a live ctx: %v, %v; want true", ok, err)
	}
	cancel()
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("the connection after a fast-path call whose ctx ended after it: %v", err)
	}

	c = rawConn(t, srv.Addr())
	if _, err := raw.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(c.PgConn().PID())); err != nil {
		t.Fatal(err)
	}
	if _, err := postgresexport.FastUnlock(ctx, c.PgConn(), bkey); err == nil || !c.PgConn().IsClosed() {
		t.Fatalf("fast-path unlock on a terminated session: %v, connection closed %v; want an error and a closed connection", err, c.PgConn().IsClosed())
	}
}
