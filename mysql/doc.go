// Package mysql is the dlock driver for MariaDB (tested with 10.11) and
// MySQL 5.7 or later, built on database/sql and
// github.com/go-sql-driver/mysql: session user locks (GET_LOCK), expired by
// the server's wait_timeout, with durable fencing tokens from a table.
//
//	import _ "github.com/dlock/dlock/mysql"
//
//	locker, err := dlock.Open(ctx, "mysql://app:secret@db:3306/app?tls=true&ttl=10s")
//
// or, on the application's *sql.DB (each lease holds one of its
// connections):
//
//	locker, err := mysql.New(db, nil)
//
// The driver was written from outside dlock's tree, on its public packages
// only (dlock, dlock/driver, dlock/conformance and dlocktest), as a
// seventh backend's author would; README.md beside it says what that took.
// Its server tests are in the module mysql/tests, which keeps the Docker
// harness out of this module's requirements.
//
// # URLs
//
//	mysql://user:pass@host:port/database[?params]
//
// Parameters: the lock options of [dlock.Options] (ttl, refresh, …);
// prefix, fencing=false and fence_table ([Options]); tls=true and the
// tls_* parameters of dlock/driver; connect_timeout, max_open_conns and
// max_idle_conns (see [ParseURL]). Any other is rejected.
//
// # Why user locks, and not a table
//
// The conformance suite asks four things of a backend: that the server, not
// the holder, ends a lock whose holder went silent (paused, partitioned),
// and no earlier than its ValidUntil; that a loss be reported; that grants
// carry increasing fencing tokens; and that waiters be woken rather than
// made to poll where the server can. A table of locks with an expiry
// column meets the first only if every acquirer compares against the
// server's clock and deletes expired rows itself, and makes every grant a
// write. GET_LOCK needs no table: the lock is the session's, so the server
// frees it when the session ends, and it ends the session of a holder that
// sent nothing for wait_timeout seconds, which the driver sets to the TTL.
// A refresh is any statement (the driver asks IS_USED_LOCK, which also
// tells a lost lease). A waiter waits in GET_LOCK with a timeout, which the
// server ends when the lock is freed. Fencing tokens come from a one-row
// counter table, bumped in an autocommitted UPDATE after the grant, so
// that they increase across crashes (a MariaDB sequence's NEXTVAL, tried
// first, handed a token out twice across a kill: its write is not flushed
// at once).
//
// # Guarantees
//
//   - Exclusive while the holder's session lives. A silent holder's session
//     ends wait_timeout after its last statement finished: after its
//     ValidUntil, and at most [ExpirySlack] later. TTLs are whole seconds
//     ([MinTTL] 1s; others rounded up, and ValidUntil counts the rounded
//     TTL).
//   - A connection that fails (reset, a statement given up on, the server
//     restarted or the session killed) ends the session and the lock; the
//     lease reports the loss at its next refresh or check, or at its
//     ValidUntil.
//   - Fencing ([dlock.Lease.Fence]): the counter of a one-row InnoDB table
//     (default dlock_fence in the URL's database, made on first use),
//     bumped after the grant, increasing across crashes and restarts. A
//     restart ends every lock (the leases report it).
//   - Waiting is the server's: a waiting Acquire waits in GET_LOCK, which
//     the server ends when the lock is released or its holder's session
//     ends (NotifiedWait); not FIFO (the server does not promise an order).
//     An Acquire given up on (its ctx ended) ends its session from
//     another connection (KILL), so that the server does not grant the
//     lock to a session nobody reads.
//   - Each lease holds a pooled connection, and so does each waiting
//     Acquire: max_open_conns bounds the leases and waits of a Locker;
//     past it, an acquisition waits for a connection.
//     Not behind a proxy that moves statements between server sessions
//     (ProxySQL's multiplexing, say): the lock is the session's.
//
// # Not supported
//
// Semaphores, read/write locks and elections fail with an error matching
// errors.ErrUnsupported:
//
//   - Read/write locks: GET_LOCK has no shared mode (a user lock is
//     exclusive). Readers would have to be counted beside it (a user lock
//     per reader, say), and a writer poll them all, at several round trips
//     per acquisition; not built.
//   - Semaphores: GET_LOCK counts nothing. Limit slot locks tried in turn
//     would work, at up to limit round trips per attempt, all polled; not
//     built.
//   - Elections need the holder's candidate readable by others
//     (Capabilities.Metadata): a user lock stores no value, only its
//     holder's connection id.
//
// # Task queue
//
// Package [github.com/dlock/dlock/mysql/mysqlqueue], in this module, is
// the queue driver of mysql:// URLs (package dlock/queue) on MariaDB 10.6
// or MySQL 8.0 and later: one InnoDB table, claims taken with FOR UPDATE
// SKIP LOCKED, waiting Clients polling (MySQL has no notifications).
// Importing this package does not link it.
//
// # Round trips
//
// On the pools the driver opens itself (a URL, NewFromConfig), whose
// connections take several statements per request, an attempt is one
// request (SET wait_timeout, GET_LOCK and the fence UPDATE together), a
// release one (RELEASE_LOCK and the SET that puts wait_timeout back), a
// refresh one; a waiting Acquire that found the lock busy adds the wait
// and, once granted, one request for the fence (or a check). On an
// application's pool ([New]) each statement is a request of its own:
// three per attempt, two per release. Values go into statements as
// literals, never as parameters, which the client library would prepare
// in a round trip of their own. With fencing, an attempt's grant waits for
// the fence UPDATE's commit to be flushed to disk: fencing=false saves
// that write.
//
// # Inspect
//
// [dlock.Locker.Inspect] (and dlock inspect mysql://…) names the session
// that holds a lock: its connection id, as IS_USED_LOCK gives it, with its
// user and host when the process list shows them (another user's session
// needs the PROCESS privilege). The fencing token is known only for the
// inspecting Locker's own leases; the lease token, metadata, grant time,
// TTL left and waiters are not stored on the server, and names are not
// listed (no InspectPrefix).
//
// # Layout
//
// A lock is the user lock named [LockName](prefix, name): prefix+name
// itself up to 64 characters, so from any client
//
//	SELECT GET_LOCK('billing/nightly-invoices', 10);
//
// waits for dlock's lock "nightly-invoices" (prefix billing/) and takes
// it, and SELECT IS_USED_LOCK('billing/nightly-invoices') gives the
// holder's connection id (SHOW PROCESSLIST). User locks are server-wide:
// the database in the URL holds only the fencing table.
package mysql
