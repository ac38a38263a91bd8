package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/tests/internal/testutil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		opts     postgres.Options
		maxConns int32
	}{
		{"postgres://u:p@h:5432/db", postgres.Options{}, postgres.DefaultMaxConns},
		{"postgresql://u:p@h/db?sslmode=disable&pool_max_conns=5", postgres.Options{}, 5},
		{"postgres://h/db?ttl=10s&refresh=false&prefix=app/&fencing=false&session_pooler=true&application_name=x",
			postgres.Options{Defaults: dlock.Options{TTL: 10 * time.Second, NoRefresh: true}, KeyPrefix: "app/", NoFencing: true, SessionPooler: true}, postgres.DefaultMaxConns},
		{"postgres://h/db?fencing=true", postgres.Options{}, postgres.DefaultMaxConns},
		{"postgres://h/db?shared_sessions=true&shared_conns=2&wait_conns=8",
			postgres.Options{SharedSessions: true, SharedConns: 2, WaitConns: 8}, postgres.DefaultMaxConns},
		{"postgres://h/db?shared_sessions=false", postgres.Options{NoSharedSessions: true}, postgres.DefaultMaxConns},
	} {
		u, _ := url.Parse(tc.url)
		cfg, opts, err := postgres.ParseURL(u)
		if err != nil {
			t.Errorf("ParseURL(%s): %v", tc.url, err)
			continue
		}
		if *opts != tc.opts {
			t.Errorf("ParseURL(%s) options = %+v, want %+v", tc.url, *opts, tc.opts)
		}
		if cfg.MaxConns != tc.maxConns {
			t.Errorf("ParseURL(%s) MaxConns = %d, want %d", tc.url, cfg.MaxConns, tc.maxConns)
		}
		for _, k := range []string{"prefix", "fencing", "session_pooler", "ttl", "refresh", "shared_sessions", "shared_conns", "wait_conns"} {
			if _, ok := cfg.ConnConfig.RuntimeParams[k]; ok {
				t.Errorf("ParseURL(%s) passes %s to the server", tc.url, k)
			}
		}
	}
}

func TestParseURLInvalid(t *testing.T) {
	for _, raw := range []string{
		"redis://h/db",
		"postgres://u:s3cret@h/db?fencing=maybe",
		"postgres://u:s3cret@h/db?session_pooler=2x",
		"postgres://u:s3cret@h/db?shared_sessions=yes",
		"postgres://u:s3cret@h/db?shared_conns=0",
		"postgres://u:s3cret@h/db?wait_conns=many",
		"postgres://u:s3cret@h/db?prefix=a&prefix=b",
		"postgres://u:s3cret@h/db?ttl=soon",
		"postgres://u:s3cret@h/db?sslmode=bogus",
		"postgres://u:s3cret@h/db?pool_max_conns=many",
		"postgres://u:s3cret@h:99999999/db",
		"postgres:opaque",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = postgres.ParseURL(u)
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("ParseURL(%s): got %v, want ErrInvalid", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%s): the error shows the password: %v", raw, err)
		}
	}
}

func TestSchemesRegistered(t *testing.T) {
	for _, s := range []string{"postgres", "postgresql"} {
		if !slices.Contains(dlockdriver.Schemes(), s) {
			t.Errorf("scheme %s not registered", s)
		}
	}
}

func TestOpen(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	raw := rawConn(t, srv.Addr())
	l, err := dlock.Open(ctx, dsn(srv.Addr())+"&ttl=5s&prefix=opened/&application_name=dlock-open-test")
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	c := l.Capabilities()
	if !c.Fencing || !c.FIFO || !c.NotifiedWait || !c.ConnectionBound || c.SurvivesRestart || c.MinTTL != postgres.MinTTL || c.ExpirySlack != postgres.ExpirySlack {
		t.Errorf("Capabilities() = %+v", c)
	}
	name := uniqueName(t)
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 5*time.Second {
		t.Errorf("TTL() = %v, want the URL's 5s", ls.TTL())
	}
	holderPID(t, raw, "opened/"+name)
	var app string
	if err := raw.QueryRow(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", holderPID(t, raw, "opened/"+name)).Scan(&app); err != nil || app != "dlock-open-test" {
		t.Errorf("holder's application_name = %q, %v", app, err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// fencing=false: no tokens.
	nf, err := dlock.Open(ctx, dsn(srv.Addr())+"&fencing=false")
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, nf)
	if nf.Capabilities().Fencing {
		t.Error("fencing=false declares Fencing")
	}
	ls, err = nf.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ls.Fence(); ok {
		t.Error("a lease from fencing=false has a fence")
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOpenFails(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	for _, tc := range []struct{ what, url string }{
		{"wrong password", "postgres://postgres:wr0ngpass@" + srv.Addr() + "/postgres?sslmode=disable"},
		{"unknown parameter", dsn(srv.Addr()) + "&tll=5s"},
		{"unreachable", "postgres://postgres:wr0ngpass@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"},
	} {
		l, err := dlock.Open(ctx, tc.url)
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("%s: Open succeeded", tc.what)
			continue
		}
		if strings.Contains(err.Error(), "wr0ngpass") {
			t.Errorf("%s: the error shows the password: %v", tc.what, err)
		}
		t.Logf("%s: %v", tc.what, err)
	}
}

// SharedSessions and NoSharedSessions contradict each other: New and
// NewFromConfig refuse them together.
func TestSharedAndNoSharedInvalid(t *testing.T) {
	opts := &postgres.Options{SharedSessions: true, NoSharedSessions: true}
	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.NewFromConfig(t.Context(), cfg, opts); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("NewFromConfig: got %v, want ErrInvalid", err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg) // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.New(pool, opts); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New: got %v, want ErrInvalid", err)
	}
}

// appPool is an application's pool of maxConns connections to addr, with
// params added to the URL, closed at the test's end.
func appPool(t *testing.T, addr, params string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn(addr) + params)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// New takes the application's pool: a lease holds one of its connections,
// and gives it back after the release with the session's settings as they
// were (idle_session_timeout and synchronous_commit, which a lease's session
// has at the TTL and off), whether it waited, tried, or found the lock busy.
// Closing the Locker leaves the pool open. (A connection per lease: with
// the defaults, a pool of 2 has one place for a lock of its own.)
func TestApplicationPool(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	pool := appPool(t, srv.Addr(), "&idle_session_timeout=77000", 2)
	l, err := postgres.New(pool, &postgres.Options{NoSharedSessions: true})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t)
	settingsKept := func(after string) {
		t.Helper()
		for range 2 { // both of the pool's connections
			var idle, sync string
			if err := pool.QueryRow(ctx, "SELECT current_setting('idle_session_timeout'), current_setting('synchronous_commit')").Scan(&idle, &sync); err != nil {
				t.Fatal(err)
			}
			if idle != "77s" || sync != "on" {
				t.Errorf("after %s a pool connection has idle_session_timeout %q, synchronous_commit %q; want the pool's own 77s, on", after, idle, sync)
			}
		}
	}
	for i := range 4 {
		acquire, what := l.TryAcquire, "TryAcquire and Release"
		if i%2 == 1 {
			acquire, what = l.Acquire, "Acquire and Release"
		}
		ls, err := acquire(ctx, name, &dlock.Options{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().AcquiredConns(); n != 1 {
			t.Errorf("a lease holds %d of the pool's connections, want 1", n)
		}
		if i == 3 { // a busy attempt on the other connection changes nothing either
			if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire of a held lock: %v", err)
			}
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 { // a pool of two parks nothing
			t.Errorf("after release %d connections stay acquired", n)
		}
		settingsKept(what)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Errorf("the pool after the Locker's Close: %v", err)
	}
	if _, err := postgres.New(nil, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New(nil): got %v, want ErrInvalid", err)
	}
}

// A released lease whose TTL is parkMinTTL (1s) or more leaves its
// connection parked, set up for the next acquisition, which runs on the same
// session; within 1s the connection is back in the pool with the
// application's settings. A shorter TTL gives the connection back at once.
func TestParkedConnection(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	pool := appPool(t, srv.Addr(), "&idle_session_timeout=77000", 4) // parks one
	l, err := postgres.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	name := uniqueName(t)
	holder := func() (pid int32) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid AND objid = (hashtextextended($1, 0) & 4294967295)::oid`, name).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	cycle := func(acquire func(context.Context, string, *dlock.Options) (*dlock.Lease, error), ttl time.Duration) int32 {
		t.Helper()
		ls, err := acquire(ctx, name, &dlock.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		pid := holder()
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	pid := cycle(l.Acquire, 2*time.Second)
	if n := pool.Stat().AcquiredConns(); n != 1 {
		t.Errorf("right after a release with a 2s TTL, %d connections are out of the pool, want 1 (parked)", n)
	}
	// The parked session no longer holds the lock (its release was a
	// fast-path call): another session takes it at once. (The next
	// acquisition on the parked session would not tell: a session takes an
	// advisory lock it holds again.)
	var free bool
	if err := pool.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AND pg_advisory_unlock(hashtextextended($1, 0))", name).Scan(&free); err != nil || !free {
		t.Fatalf("after the release of a parked connection's lease, another session's pg_try_advisory_lock: %v, %v; want true", free, err)
	}
	if again := cycle(l.TryAcquire, 2*time.Second); again != pid {
		t.Errorf("the next acquisition ran on backend %d, want %d (the parked connection's)", again, pid)
	}
	for deadline := time.Now().Add(time.Second); pool.Stat().AcquiredConns() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("1s after the release %d connections stay out of the pool", pool.Stat().AcquiredConns())
		}
	}
	idle := pool.AcquireAllIdle(ctx)
	for _, c := range idle {
		var idle, sync string
		if err := c.QueryRow(ctx, "SELECT current_setting('idle_session_timeout'), current_setting('synchronous_commit')").Scan(&idle, &sync); err != nil {
			t.Fatal(err)
		}
		if idle != "77s" || sync != "on" {
			t.Errorf("a connection back from parking has idle_session_timeout %q, synchronous_commit %q; want the pool's own 77s, on", idle, sync)
		}
		c.Release()
	}
	if len(idle) == 0 {
		t.Error("no idle connection in the pool")
	}
	cycle(l.Acquire, 500*time.Millisecond)
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("right after a release with a 500ms TTL, %d connections are out of the pool, want 0", n)
	}
}

// Every way a lease ends gives its connection back to the application's
// pool (closed, when the session ended or is in doubt): expiry, termination,
// a cancelled wait, the Locker's Close.
func TestConnectionsReturned(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	raw := rawConn(t, srv.Addr())
	pool := appPool(t, srv.Addr(), "", 4)
	l, err := postgres.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	returned := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: %d connections still out of the pool", what, pool.Stat().AcquiredConns())
			}
		}
	}
	name := uniqueName(t)

	ls, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: postgres.MinTTL, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	lostWithin(t, ls, 2*time.Second)
	returned("expiry")

	ls, err = l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(ctx, "SELECT pg_terminate_backend($1)", holderPID(t, raw, name)); err != nil {
		t.Fatal(err)
	}
	lostWithin(t, ls, 2*time.Second)
	returned("termination")

	other := newLocker(t, srv.Addr(), nil)
	lo, err := other.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := l.Acquire(wctx, name, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait behind another holder: got %v, want DeadlineExceeded", err)
	}
	cancel()
	returned("a cancelled wait")
	if err := lo.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for i := range 3 {
		if _, err := l.TryAcquire(ctx, fmt.Sprint(name, i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := pool.Stat().AcquiredConns(); n != 3 {
		t.Errorf("3 leases hold %d connections", n)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	returned("Close")
	if n, limit := pool.Stat().TotalConns(), pool.Config().MaxConns; n > limit {
		t.Errorf("%d connections in a pool of %d", n, limit)
	}
}

// The driver prepares its statements once per connection; a session whose
// prepared statements were dropped (DISCARD ALL, DEALLOCATE ALL, as some
// pool reset hooks run) prepares them again, and the lock works as before.
// (The test's own queries use the simple protocol: pgx's statement cache does
// not survive the drop. A connection per lease: with the defaults, a pool
// of 1 shares its session.)
func TestPreparedStatementsDropped(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	pool := appPool(t, srv.Addr(), "", 1)
	l, err := postgres.New(pool, &postgres.Options{NoSharedSessions: true})
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	name := uniqueName(t)
	prepared := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'dlock%'", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, drop := range []string{"", "DEALLOCATE ALL", "DISCARD ALL"} {
		if drop != "" {
			if _, err := pool.Exec(ctx, drop, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			if n := prepared(); n != 0 {
				t.Fatalf("after %s the session still has %d dlock statements", drop, n)
			}
		}
		for _, acquire := range []func(context.Context, string, *dlock.Options) (*dlock.Lease, error){l.TryAcquire, l.Acquire} {
			ls, err := acquire(ctx, name, nil)
			if err != nil {
				t.Fatalf("after %q: %v", drop, err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatalf("after %q: release: %v", drop, err)
			}
		}
		if n := prepared(); n != 3 {
			t.Errorf("after %q the session has %d dlock statements, want 3 (try, wait, release)", drop, n)
		}
	}
}
