package readme_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/fence/pgfence"
	_ "github.com/dlock/dlock/postgres"
	"github.com/dlock/dlock/tests/internal/testutil"
)

// setBalance is the README's fenced write: the guard's check and the update
// commit together.
func setBalance(ctx context.Context, pool *pgxpool.Pool, guard *pgfence.Guard, ls *dlock.Lease, balance int) error {
	token, _ := fence.Token(ls)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := guard.Check(ctx, tx, "account:42", token); err != nil {
			return err // fence.ErrStale: a newer holder has written
		}
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = 42", balance)
		return err
	})
	return err
}

// The README's fence snippet: the holder of the newer lease writes, the
// holder of the older one is refused and its update rolled back.
func TestFencedWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := dlocktest.Require(t, dlocktest.Postgres)
	dsn := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dlocktest.PostgresUser, dlocktest.PostgresPassword, srv.Addr(), dlocktest.PostgresDatabase)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table := "accounts_fence_" + testutil.RandomHex(4)
	guard, err := pgfence.New(table)
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance int NOT NULL);
		INSERT INTO accounts VALUES (42, 0) ON CONFLICT (id) DO UPDATE SET balance = 0`); err != nil {
		t.Fatal(err)
	}
	l, err := dlock.Open(ctx, dsn+"&prefix=readme-"+testutil.RandomHex(4)+"-")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	old, err := l.Acquire(ctx, "account:42", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); err != nil { // stands for a lease lost while its holder was paused
		t.Fatal(err)
	}
	cur, err := l.Acquire(ctx, "account:42", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Release(ctx)
	if err := setBalance(ctx, pool, guard, cur, 10); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := setBalance(ctx, pool, guard, old, 99); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the old holder's write: got %v, want fence.ErrStale", err)
	}
	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 42`).Scan(&balance); err != nil || balance != 10 {
		t.Errorf("balance %d (err %v), want 10", balance, err)
	}
}
