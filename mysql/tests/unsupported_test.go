package tests_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/mysql"
	gomysql "github.com/go-sql-driver/mysql"
)

// Semaphores, read/write locks and elections fail with an error matching
// errors.ErrUnsupported, before any I/O (the pool's host does not exist).
// (mysql:// has a queue driver: package mysql/mysqlqueue, queue_test.go.)
func TestUnsupported(t *testing.T) {
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", "nonexistent.invalid:3306"
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	l, err := mysql.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := t.Context()
	noop := func(context.Context, *dlock.Lease) error { return nil }
	for what, err := range map[string]error{
		"Semaphore": second(l.Semaphore("s", 2)),
		"RWLock":    second(l.RWLock("rw")),
		"Elect":     second(l.Elect(ctx, "e", "c1", nil)),
		"Observe":   second(l.Observe(ctx, "e")),
		"Leader":    second(l.Leader(ctx, "e")),
		"Campaign":  l.Campaign(ctx, "e", "c1", nil, noop),
	} {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s = %v, want errors.ErrUnsupported", what, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
