package pgqueue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The helpers below are tests/postgres's (postgres_test.go), for the
// queue's tests.

func TestMain(m *testing.M) { dlocktest.Main(m) }

// dsn is the URL of the test server at addr.
func dsn(addr string) string {
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dlocktest.PostgresUser, dlocktest.PostgresPassword, addr, dlocktest.PostgresDatabase)
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

var nameSeq atomic.Int64

func uniqueName(t testing.TB) string {
	return fmt.Sprintf("dlock-test/%s/%d-%d", t.Name(), time.Now().UnixNano(), nameSeq.Add(1))
}
