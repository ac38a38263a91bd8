package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/servers"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := servers.CloseAll(); err != nil {
		fmt.Fprintln(os.Stderr, "closing test servers:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

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
