// Package postgres is the dlock driver for PostgreSQL 14 or later, built on
// github.com/jackc/pgx/v5: session advisory locks, queued (FIFO) and expired
// by the server, with durable fencing tokens, on the database whose data
// they protect.
//
//	import _ "github.com/dlock/dlock/postgres"
//
//	locker, err := dlock.Open(ctx, "postgres://app:secret@db:5432/app?sslmode=verify-full&ttl=10s")
//
// or, on the application's *pgxpool.Pool (locks hold one of its
// connections each up to half of MaxConns, then share a few; a waiting
// Acquire, a permit and a read/write lock hold one each):
//
//	locker, err := postgres.New(pool, nil)
//
// # URLs
//
//	postgres://user:pass@host:port/database[?params]
//
// Parameters: the lock options of [dlock.Options] (ttl, refresh, …); prefix,
// fencing=false, fence_schema, session_pooler, shared_sessions, shared_conns
// and wait_conns ([Options]); pgxpool's own (sslmode, pool_max_conns, …);
// any other is sent to the server as a run-time setting.
//
// # Guarantees
//
//   - Exclusive while the holder's session lives, whose idle_session_timeout
//     is the TTL; its end frees the lock and the lease reports the loss.
//   - Fencing ([dlock.Lease.Fence]): nextval of a sequence after the grant,
//     increasing across crashes and restarts; a restart itself ends every
//     lock (the leases report it).
//   - FIFO: the server's own lock queue; no polling. Not behind a transaction
//     pooler (detected and refused).
//   - Semaphores, read/write locks (a waiting writer keeps new readers out)
//     and leader election, held and lost with the session as locks are.
//   - Many leases: locks take a connection each up to half of the pool
//     (pool_max_conns, 32 by default), then are stacked on a few shared
//     sessions, whose end loses every lease on it; 10,000 leases on the
//     default URL. shared_sessions=false gives every lease a connection
//     (at most pool_max_conns), shared_sessions=true shares from the first.
//   - AcquireAll: one statement try-locks every name, in sorted order, on
//     one shared session, and gives back what it took when one is busy (all
//     or none, one round trip); without shared sessions, or with a TTL under
//     [SharedMinTTL], the names are taken one by one.
//   - No [dlock.Locker.Steal]: a lock belongs to its holder's session, which
//     only ending that session frees (pg_terminate_backend), taking every
//     other lock of the session with it.
//
// # Layout
//
// A lock is the advisory lock on hashtextextended(KeyPrefix || name, 0) in
// the URL's database, so from psql
//
//	SELECT pg_advisory_lock(hashtextextended('jobs/nightly', 0));
//
// takes dlock's lock "jobs/nightly" until pg_advisory_unlock or the
// session's end; pg_locks shows the holder's pid. The records of
// [dlock.Locker.Once] are rows of the table dlock_records, created on first
// use in the fencing schema.
//
// [DESIGN.md] beside this package has the rest: expiry, loss, waiting,
// fencing, costs, shared sessions, the primitives' keys and psql for each.
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/postgres/DESIGN.md
package postgres
