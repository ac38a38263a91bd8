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

// The same lock from psql, connected to the same database: dlock's key for
// a name is hashtextextended(prefix || name, 0).
//
//	SELECT pg_try_advisory_lock(hashtextextended('billing/nightly-invoices', 0));
//	-- f while a dlock lease holds it; t otherwise, and dlock waits until
//	SELECT pg_advisory_unlock(hashtextextended('billing/nightly-invoices', 0));
//
//	-- who holds it:
//	SELECT l.pid, a.application_name, a.client_addr
//	FROM pg_locks l JOIN pg_stat_activity a USING (pid)
//	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
//	  AND l.classid = ((hashtextextended('billing/nightly-invoices', 0) >> 32) & 4294967295)::oid
//	  AND l.objid = (hashtextextended('billing/nightly-invoices', 0) & 4294967295)::oid;
func Example_psql() {}

func runInvoices(ctx context.Context, fence uint64) { _, _ = ctx, fence }
