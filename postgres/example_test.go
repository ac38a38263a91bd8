package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Opening a Locker from a URL: libpq parameters go to pgx, ttl and prefix to
// dlock. The Locker owns its pool.
func Example_open() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "postgres://app:secret@db.internal:5432/app?sslmode=verify-full&ttl=10s&prefix=billing/")
	if err != nil {
		log.Fatal(err) // the password is never in the error
	}
	defer locker.Close(ctx)

	lease, err := locker.Acquire(ctx, "nightly-invoices", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	// Pass the fencing token to the resource, and stop when the lease ends.
	fence, _ := lease.Fence()
	runInvoices(lease.Context(), fence)
}

// A Locker on the application's own pool. Each lease, and each waiting
// Acquire, keeps one of the pool's connections for its whole life.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app:secret@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locker, err := postgres.New(pool, &postgres.Options{Defaults: dlock.Options{TTL: 30 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx) // leaves the pool open

	lease, err := locker.TryAcquire(ctx, "cache-rebuild", nil)
	if errors.Is(err, dlock.ErrNotAcquired) {
		fmt.Println("someone else is rebuilding")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	// ...
}

// The same lock from psql or any SQL client on the same database: dlock's
// key for a name is hashtextextended(prefix || name, 0), so
//
//	SELECT pg_try_advisory_lock(hashtextextended('billing/nightly-invoices', 0));
//
// is f while a dlock lease holds it (and takes it, keeping dlock waiting,
// when it is t), and this query shows who holds it.
func Example_psql() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var pid int
	var app string
	err = pool.QueryRow(ctx, `
		SELECT l.pid, a.application_name
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
		  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid`,
		"billing/nightly-invoices").Scan(&pid, &app)
	fmt.Println(pid, app, err)
}

func runInvoices(ctx context.Context, fence uint64) { _, _ = ctx, fence }
