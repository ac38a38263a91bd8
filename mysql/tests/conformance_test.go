package tests_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/mysql"
	gomysql "github.com/go-sql-driver/mysql"
)

func TestMain(m *testing.M) { dlocktest.Main(m) }

// url is the mysql:// URL of the test server at addr.
func url(addr, query string) string {
	u := fmt.Sprintf("mysql://%s:%s@%s/%s", dlocktest.MariaDBUser, dlocktest.MariaDBPassword, addr, dlocktest.MariaDBDatabase)
	if query != "" {
		u += "?" + query
	}
	return u
}

// rawDB is a pool straight to the server at addr, bypassing dlock, closed
// when the test ends.
func rawDB(t testing.TB, addr string) *sql.DB {
	t.Helper()
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", addr, dlocktest.MariaDBDatabase
	cfg.User, cfg.Passwd = dlocktest.MariaDBUser, dlocktest.MariaDBPassword
	cfg.Timeout = 5 * time.Second
	cfg.Logger = &gomysql.NopLogger{}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// harness gives every locker a pool of its own dialling the server through
// its own faultnet proxy.
type harness struct {
	addr string
	raw  *sql.DB
	opts mysql.Options // without Defaults
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p := faultnet.ListenT(t, h.addr)
	o := h.opts
	if defaults != nil {
		o.Defaults = *defaults
	}
	cfg, _, err := mysql.ParseURL(mustURL(t, url(p.Addr(), "")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := mysql.NewFromConfig(ctx, cfg, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue names the session holding name's user lock, if any, and the
// sessions waiting for it in GET_LOCK (the driver's waits, wait.sql, which
// it ends when they are given up).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	var holder sql.NullInt64
	key := mysql.LockName(h.opts.KeyPrefix, name)
	if err := h.raw.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", key).Scan(&holder); err != nil {
		return nil, err
	}
	var left []string
	if holder.Valid {
		left = append(left, fmt.Sprintf("user lock %q held by connection %d", key, holder.Int64))
	}
	// The pattern is anchored at the wait's start, which this query's
	// own text (shown in the list with its parameter) does not match.
	rows, err := h.raw.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE ?",
		fmt.Sprintf("SELECT GET_LOCK(_utf8mb4 X'%x', %% AS `dlock wait %%", key))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		left = append(left, fmt.Sprintf("connection %d waiting for user lock %q", id, key))
	}
	return left, rows.Err()
}

// ownServer is a harness on a server of the test's own, which the suite's
// Chaos section may pause and restart.
type ownServer struct {
	harness
	srv *dlocktest.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// The suite, Chaos section included, on a server of its own that it may
// pause and restart; on an external server (DLOCK_MARIADB_ADDR) without
// server faults.
func TestConformance(t *testing.T) {
	if os.Getenv("DLOCK_MARIADB_ADDR") != "" {
		srv := dlocktest.Require(t, dlocktest.MariaDB)
		conformance.Run(t, harness{addr: srv.Addr(), raw: rawDB(t, srv.Addr())})
		return
	}
	srv := dlocktest.RequireNew(t, dlocktest.MariaDB)
	conformance.Run(t, ownServer{harness{addr: srv.Addr(), raw: rawDB(t, srv.Addr())}, srv})
}

// appPool is a harness whose lockers are built by mysql.New on a pool of
// the test's, as an application's, whose connections take one statement
// per request: the driver's other path.
type appPool struct{ harness }

func (h appPool) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p := faultnet.ListenT(t, h.addr)
	o := h.opts
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := mysql.New(rawDB(t, p.Addr()), &o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// The suite on lockers of mysql.New, without server faults (TestConformance
// has them, on the driver's own pools).
func TestConformanceAppPool(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.MariaDB)
	conformance.Run(t, appPool{harness{addr: srv.Addr(), raw: rawDB(t, srv.Addr())}})
}
