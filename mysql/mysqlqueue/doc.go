// Package mysqlqueue is the MariaDB (10.6 or later) and MySQL (8.0 or
// later) backend of package [github.com/dlock/dlock/queue]: a delayed task
// queue in one InnoDB table, claims taken with FOR UPDATE SKIP LOCKED.
//
//	import _ "github.com/dlock/dlock/mysql/mysqlqueue"
//
//	c, err := queue.Open(ctx, "mysql://app:secret@db:3306/app")
//
// or [NewQueue](db, opts) on the application's *sql.DB; closing the Client
// leaves db open. Like the lock driver beside it, it is written on dlock's
// public packages only (queue, queue/driver, queue/conformance).
//
// # URLs
//
//	mysql://user:pass@host:port/database[?queue_table=T&poll_interval=50ms]
//
// The lock driver's URL form (package [github.com/dlock/dlock/mysql]:
// tls and tls_*, connect_timeout, max_open_conns, max_idle_conns), with
// queue_table the table's name or schema.name ([Options].Table, default
// [DefaultTable]) and poll_interval how often a waiting Client polls
// ([Options].PollInterval, default [DefaultPollInterval]); the lock
// options (ttl, prefix, fence_table, …) are accepted and ignored. Open's
// pool interpolates parameters client-side (one round trip per statement).
//
// # Guarantees
//
// Package queue's semantics: due times and claim deadlines on the server's
// clock (UTC_TIMESTAMP(6), whatever the session's time zone), kept in ms
// and rounded the safe way; every operation one statement, except Claim
// and Pop, which are one transaction each (READ COMMITTED: the rows they
// take are locked, no gaps), so each is committed or not at all; tasks as
// durable as InnoDB's commits (innodb_flush_log_at_trx_commit). A claim's
// token is checked by Ack, Extend and Nack in their WHERE clause, with its
// deadline: a worker whose claim ran out and was taken by another changes
// nothing. The table is created on first use (which needs the CREATE
// privilege); an administrator may run tasks.sql instead. With binary
// logging on, binlog_format must be ROW or MIXED (the servers' defaults):
// READ COMMITTED writes are refused under STATEMENT.
//
// Waiting polls: MySQL has no notifications, so a Client whose ClaimWait or
// PopWait waits asks the server for the next due time of the queues it
// waits on (one statement for all of them, two index dives per queue):
// 5ms after a waiter arrives or the next due time changed, then at twice
// the interval each time, up to PollInterval. A task enqueued, nacked or
// requeued by another Client reaches a waiter within about PollInterval
// (a task delayed 20ms, enqueued as a worker began to wait: claimed 6 to
// 7ms after its due time at the median, 18 to 23ms at p99, on loopback);
// by the same Client, at once. An idle waiter costs the server that one
// statement per PollInterval, and a Claim or Pop that finds nothing due
// one statement (no transaction).
//
// # Layout
//
// One table, dlock_tasks by default, keyed by (queue, id), with one index
// (queue, state, due, id); tasks.sql has its DDL and what each column
// holds. Due times are BIGINT ms since the Unix epoch, so from any client
//
//	SELECT id, state, FROM_UNIXTIME(due / 1000) FROM dlock_tasks WHERE queue = 'orders';
//
// lists a queue (state 0 waiting, 1 claimed, 2 dead; FROM_UNIXTIME shows
// the session's time zone).
package mysqlqueue
