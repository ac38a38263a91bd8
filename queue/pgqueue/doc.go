// Package pgqueue is the PostgreSQL backend of package
// [github.com/dlock/dlock/queue]: a delayed task queue in one table, every
// operation one statement, claims taken with FOR UPDATE SKIP LOCKED and
// waiting Clients woken by LISTEN/NOTIFY.
//
//	import _ "github.com/dlock/dlock/queue/pgqueue"
//
//	c, err := queue.Open(ctx, "postgres://user:pass@db:5432/app")
//
// or [NewQueue](pool, opts) on the application's *pgxpool.Pool; closing the
// Client leaves the pool open.
//
// # URLs
//
//	postgres://user:password@host:port/database[?queue_table=T]
//	postgresql://…      the same
//
// The lock driver's URL form (package [github.com/dlock/dlock/postgres]:
// TLS and pgx's pool parameters), with queue_table the table's name
// ([QueueOptions].Table, default [DefaultQueueTable]); lock options are
// accepted and ignored.
//
// # Guarantees
//
// Package queue's semantics: due times and claim deadlines on the server's
// clock, to the millisecond, rounded the safe way; each operation one
// statement, so committed or not at all; tasks as durable as the database's
// commits. The table is created on first use (which needs the right to
// create it); an administrator may run tasks.sql instead. A waiting Client
// holds one connection of the pool, LISTENing, while it waits.
//
// The table, its index and the advisory keys of the wake-ups are described
// in the backends' [DESIGN.md].
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/queue/DESIGN.md
package pgqueue
