// Package postgres is the dlock driver for PostgreSQL 14 or later, built on
// github.com/jackc/pgx/v5: session advisory locks, queued (FIFO) and expired
// by the server, with durable fencing tokens — on the database whose data
// they protect.
//
//	import _ "github.com/dlock/dlock/postgres"
//
//	locker, err := dlock.Open(ctx, "postgres://app:secret@db:5432/app?sslmode=verify-full&ttl=10s")
//
// or, on the application's *pgxpool.Pool (a lease, and a waiting Acquire,
// each hold one of its connections):
//
//	locker, err := postgres.New(pool, nil)
//
// Guarantees in brief:
//   - Exclusive while the holder's session lives: the server holds the lock
//     (pg_advisory_lock) and frees it when the session ends, for whatever
//     reason — the lease then reports the loss, within milliseconds when the
//     connection says so.
//   - Expiry by the server: the session's idle_session_timeout is the TTL.
//   - Fencing: nextval of a sequence after the grant, never reissued after a
//     crash.
//   - FIFO: the server's own lock queue; no polling.
//   - Operators see and break locks from psql (see Layout). Not behind a
//     transaction pooler (detected and refused).
//   - Semaphores, read/write locks and leader election, each on advisory
//     keys of its own, held and lost with the session as locks are:
//     writers queue in the server and keep new readers out; permits are
//     slots, waited for in a FIFO queue with release notifications; a
//     lease's metadata (an election's candidate) is recorded in a table.
//
// The sections below are the details.
//
// # URLs
//
//	postgres://user:pass@host:port/database[?params]
//	postgresql://user:pass@host:port/database[?params]
//
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - prefix=app/ sets Options.KeyPrefix; fencing=false sets
//     Options.NoFencing; fence_schema=locks sets Options.FenceSchema;
//     session_pooler=true sets Options.SessionPooler; shared_sessions=true,
//     shared_conns=4 and wait_conns=16 set Options.SharedSessions,
//     SharedConns and WaitConns (see Shared sessions).
//   - Everything pgxpool.ParseConfig accepts, in libpq form: sslmode,
//     sslrootcert, sslcert, sslkey, connect_timeout, application_name,
//     pool_max_conns, pool_min_conns, …; any other parameter is sent to the
//     server as a run-time setting (search_path=…, tcp_keepalives_idle=…),
//     so a misspelt one is rejected by the server when Open connects.
//     Environment variables (PGHOST, PGPASSWORD, PGSSLMODE, …) and the
//     password file apply as they do for libpq.
//
// Open connects (bounded by its ctx) so that a wrong address or credential
// fails there, and the Locker owns the pool it made: pool_max_conns defaults
// to 32 rather than pgx's 4, since every lease and every waiting Acquire
// occupies one connection. Passwords never appear in errors.
//
// New takes an application's *pgxpool.Pool instead, and NewFromConfig a
// *pgxpool.Config. A lease, or a waiting Acquire, takes a connection out of
// the pool for its whole life, so size MaxConns for the leases and waits a
// process holds at once on top of its other queries.
//
// # Guarantees
//
// A lock is a session-level advisory lock, pg_advisory_lock on the key of its
// name (see Layout), held by a connection that is the lease's alone: taken
// out of the pool at the acquisition and put back only after a release that
// the server confirmed (pg_advisory_unlock returned true) and that restored
// the session's settings. The server decides: a lease is exclusive while the
// session that took the lock lives, and the session's end, for whatever
// reason, frees the lock. So a lease can end before its ValidUntil
// (Capabilities.ConnectionBound): a connection reset, pg_terminate_backend or
// a server restart end the session, and the lock, at once. The lease reports
// the loss as soon as the driver learns it: within milliseconds when the
// connection says so (a reset, the server's FATAL message; see below), at the
// next refresh otherwise; another holder may get the lock in between, so
// protect the resource with Lease.Fence.
//
// Expiry is the server's: advisory locks have no TTL, so the lease's session
// gets idle_session_timeout = TTL, and the server ends a session that runs no
// statement for that long. Every refresh is a statement on that session
// (which restarts the idle timer), so a holder that stops refreshing, or
// whose process or network vanished, loses its session, and the lock,
// between TTL and TTL + one network round trip after the last statement the
// server received: the holder's ValidUntil (counted from when that
// statement was sent, minus the drift margin) always comes first.
// Capabilities.ExpirySlack (100ms) covers the round trip and the server
// ending the session. As with any TTL lock, a refresh that reached the server
// but whose answer never came back extends the lock there without the holder
// knowing (the server may then keep it up to one TTL past ValidUntil). A
// server whose wall clock is stepped forward ends sessions early (PostgreSQL
// times idle_session_timeout on it). Lease.Held reads pg_locks for the
// lease's session and key; since running it restarts the idle timer, it first
// sets idle_session_timeout to the time the lease has left, so that asking
// does not extend the lock.
//
// The lease's connection is watched while idle: when the server ends the
// session (pg_terminate_backend, idle timeout, shutdown, restart) the lease
// reports loss within milliseconds, not only at its next refresh. Any failure
// that ends the connection (a dropped connection, a FATAL error, a statement
// that the server would not cancel) ends the lease as lost, and the
// connection is closed, never returned to the pool. A statement error that
// leaves the session alone (a cancelled statement, an SQL error) does not.
//
// Contexts: TryAcquire and Release close the connection when their ctx ends
// mid-statement (pgx does, for a statement; the driver, for a fast-path
// release); for an attempt that makes sure
// nothing is left (the session, and any lock it took, ends), and a release
// cut short that way reports the lease lost (the lock goes with the session).
// Refresh and Held must not drop a lock because their ctx ended: when it ends
// mid-statement they send the server a cancel request and wait for the
// connection to come back (a cancelled statement leaves the session and its
// lock alone); only if the server does not answer within a second is the
// connection closed, and the lease reported lost.
//
// Waiting is the server's: Acquire blocks in pg_advisory_lock, so waiters
// are granted in the order they queued (Capabilities.FIFO, NotifiedWait) and
// a release hands the lock to the next waiter without any polling. A wait cut
// short by its ctx is cancelled on the server with a cancel request (its
// backend leaves the lock queue); its connection is then closed, which also
// frees a lock granted just as the wait was cancelled. A waiter whose network
// vanished stays queued on the server until TCP keepalives or
// client_connection_check_interval (settable in the URL) end its session; if
// it is granted the lock meanwhile, the lock is free again one TTL later (the
// waiter's session has idle_session_timeout set too). A waiting backend holds
// a snapshot, as any running statement does, which holds back vacuum while it
// waits; a statement_timeout set for the role or database ends long waits,
// which Acquire then starts again at the back of the queue.
//
// Costs: an acquisition is one round trip (fencing adds a nextval), a
// release one round trip (on a connection to be parked, a fast-path call of
// pg_advisory_unlock rather than a statement: no portal, no executor), and
// the watchdog one round trip every TTL/3. A lease's session has its idle_session_timeout and
// synchronous_commit changed; after a release of a lease whose TTL is a
// second or more, its connection stays out of the pool for up to 100ms,
// parked with those settings for the next acquisition, which then changes
// none (see driver.park; a quarter of the pool's MaxConns are parked at
// most, none from a pool of fewer than four), and goes back with them
// restored. A lease, and a waiting Acquire,
// keep one connection, a lease idle
// for 50ms one goroutine reading it, and a Locker holding leases one
// goroutine that looks at them every 50ms (no timer per lease). The
// acquiring and releasing statements are prepared once per connection, under
// names that start with dlock_, when the connection uses pgx's default
// QueryExecModeCacheStatement; with any other mode (as behind a pooler) they
// go unnamed, parsed at every execution.
//
// Fencing tokens come from a sequence, dlock_fence_seq: the acquiring
// statement takes nextval after the grant, so tokens follow grant order.
// A sequence only grows while the server runs, but a crash can take back its
// last values: PostgreSQL writes a sequence's WAL record ahead of 32 values,
// and a lease's session has synchronous_commit off (its statements write no
// other WAL; the setting is restored before the connection returns to the
// pool), so that a grant never waits for a WAL flush while
// it holds the lock; the WAL writer flushes such commits within three
// wal_writer_delay (600ms by default). So each server start is an
// epoch: before a connection hands out its first token, it makes sure that
// its server start is recorded in the table dlock_fence_epoch; the first
// connection after a start records it and moves the sequence EpochGap (2^32)
// forward, in one transaction whose commit is flushed (synchronous_commit at
// least 'local'). Tokens therefore strictly increase across holders,
// releases, expiries, restarts and crashes, unless a crash took back more
// than 2^32 values (the grants of far more than the WAL writer's window);
// and across failover to a standby (synchronous or not) that missed fewer
// than 2^32 values, the new primary's start being an epoch too. The cost:
// nextval per acquisition (WAL every 32nd call, not waited for), a round trip per new
// connection, one row per server start. The sequence and table are in
// Options.FenceSchema (default "public"), created on first use; a role that
// may not create them gets an error at NewFromConfig (or at the first
// acquisition, with New), and an administrator can run DDL once instead.
// Options.NoFencing turns fencing off (Capabilities.Fencing false) and then
// nothing is stored.
//
// Read/write locks (Locker.RWLock) are the server's own shared and
// exclusive advisory locks on one key: readers take pg_advisory_lock_shared,
// writers pg_advisory_lock (the try forms for TryRLock and TryLock).
// PostgreSQL's lock manager queues a request behind a waiting one it
// conflicts with, so once a writer waits in Lock, a new reader's RLock
// queues behind it and its TryRLock fails, while the readers already
// holding keep their hold; the writer is granted when they leave, and the
// readers queued behind it when it releases. That is the writer preference
// the contract asks for, with no bookkeeping of the driver's: a writer's
// wait is its backend's place in the queue, gone when the wait is cancelled
// (readers behind it are then granted at once) or its session ends. Waiters
// of both sides are granted in the order they queued, readers together.
// Writers fence with the lock's sequence (their tokens increase with every
// write grant of the name); readers have no token. A waiting writer whose
// process or network vanished stays queued, as a lock's waiter does (see
// above), and so keeps new readers out until the server ends its session:
// TCP keepalives or client_connection_check_interval, set in the URL
// (tcp_keepalives_idle=…), bound that on a network that drops packets.
//
// Semaphores (Locker.Semaphore) are Limit slots, each an advisory lock on
// its own key: a permit is one slot held by the lease's session, so at most
// Limit sessions hold permits at once, and a session's end (expiry, crash,
// reset) gives its slot back as it does a lock. PostgreSQL has no counting
// lock, and a backend can wait for one lock only, so the driver takes the
// first free slot in one statement (permit.sql: pg_try_advisory_lock on
// slot 0, 1, … until one succeeds, O(Limit) tries when all are held) and
// waits in two stages: a waiting Acquire first queues in the server, FIFO,
// on the semaphore's queue key (permit_queue.sql); the waiter at the head
// of that queue, holding that key, LISTENs on the semaphore's channel and
// tries the slots again whenever a permit's release notifies it
// (permit_release.sql sends a NOTIFY as it unlocks), or after a backoff
// (10ms, doubling to a quarter of its TTL, 1s at most) for the slots that a
// session's end frees without a word. Once it has a slot it gives the queue
// key up, and the next waiter becomes the head. The head's session has
// idle_session_timeout at its TTL from the moment it queues, so a head
// whose process or network vanished holds the queue key one TTL at most
// (a live one runs a statement at least every quarter TTL), and the
// waiters behind it carry on. So waiting Acquires are
// served in the order they came (Capabilities.FIFO holds for them; a
// TryAcquire that finds a slot free just as it is released may take it
// before the head does), a release hands its permit on within
// milliseconds, an expired or crashed holder's within the head's backoff,
// and only one session per semaphore polls, and only while every slot is
// held. The cost: a permit's release is a notifying transaction
// (PostgreSQL serialises their commits; locks never notify), and a waiting
// head runs a statement per release it hears. Every holder also holds a
// shared advisory lock on the key of its limit; a newcomer takes its own
// limit's key before it looks in pg_locks for another limit's key of the
// name, so that of two that ask at once under different limits at least
// one sees the other: a permit asked under another limit than its holders'
// fails with dlock.ErrLimitMismatch (naming their limit), taking nothing.
// With fencing, permits carry tokens of the same sequence
// (Capabilities.PermitFencing): unique, and increasing with every grant,
// taken as they are by nextval once the slot is held. A wait cut short
// closes its connection, which ends its place in the queue, its listening
// and anything it took.
//
// Metadata (Options.Metadata, and an election's candidate) is recorded,
// for a lock whose metadata is not empty, in the table dlock_metadata of
// the fencing schema (so only with fencing: Capabilities.Metadata): one row
// per holding session, written by the lease's session right after the grant
// with its fencing token and grant time (metadata.sql), deleted after its
// release (metadata_drop.sql). Inspect reports them (Metadata, Fence,
// Since) for the session that holds the lock now (same pid and
// backend_start in pg_stat_activity: a row of a session that ended, or of a
// pid reused since, is not read; the next metadata grant deletes it), which
// is what Locker.Elect, Leader and Observe need: a leader is the holder of
// the lock of the election's name, its term its fencing token. Both
// statements notify the channel dlock_lock_<key in hex>, on which the
// driver's Watch (driver.Notifier) listens for Observe: a leader's
// resignation, and the next leader's record, are heard at once; a leader's
// end by expiry or crash at Observe's next look (up to the Locker's
// RetryMax later). Between a grant and its record (one round trip), Inspect
// shows the lock held with no metadata. A lock without metadata never
// touches the table and never notifies: its acquisition and release are
// as they were. The row is visible only to roles that can read the table
// and see the holder's backend_start in pg_stat_activity (the same role,
// or pg_read_all_stats): candidates of one election should connect as one
// role.
//
// What it does not survive:
//
//   - Restart or failover: every session ends, so every lock is lost; the
//     leases report it (Capabilities.SurvivesRestart is false). Waiters
//     queue again once the server is back.
//   - Transaction pooling (PgBouncer pool_mode=transaction and the like):
//     session locks need a session of their own. The driver refuses a
//     connection whose backend pid is not the one announced at connection
//     start (any proxy: a transaction pooler announces a key of its own),
//     checked by every acquisition, and a lease whose backend pid changes
//     between statements (checked by refresh, Held, and a release that
//     restores the session's settings). The release of a connection kept
//     for the next lease (see Costs) is a fast-path call of
//     pg_advisory_unlock, which cannot check the pid; its acquisition did,
//     on the same connection. (A transaction pooler that passed the real
//     backend's key through would break session locks anyway: another of
//     its clients could take a lock again on the session that holds it.) A
//     session pooler may be allowed with Options.SessionPooler; the pid of
//     the acquisition is then checked on every later statement, and every
//     release is a statement.
//   - Process pauses: a holder paused past its ValidUntil may resume
//     believing it holds a lock whose session the server ended; the lease
//     reports the loss once the process runs again. Pass Lease.Fence to the
//     resource.
//   - A hot standby: advisory locks there are the standby's own; with
//     fencing the acquisition fails (no nextval on a standby).
//
// # Shared sessions
//
// By default every lease holds a connection (and a server session) of its
// own, so a process holds at most pool_max_conns leases, and every process
// together at most the server's max_connections. With
// Options.SharedSessions (shared_sessions=true), locks without metadata are
// stacked on a few shared sessions instead: session advisory locks stack on
// one connection, so a Locker holds thousands of leases on at most
// SharedConns sessions per TTL (4 by default), measured at 10,000 leases on
// 4 connections, none lost. Locks with metadata keep a connection each (a
// session has one metadata row, keyed by its backend); so do semaphore
// permits (an advisory lock is re-entrant on its session, so permit.sql's
// try of slot 0, 1, … would take a slot that session already holds again:
// two permits on one slot) and read/write locks, whose statements set their
// session up, queue and listen on it. They come from the pool: when it is
// full, one fails within a second with dlock.ErrResourceLimit naming
// pool_max_conns, while locks go on being granted on the shared sessions
// (TestSharedPermitsBoundedByPool).
//
//   - Acquisition: one pg_try_advisory_lock on a shared session of the
//     lease's TTL. Only when the lock is busy does a waiting Acquire take a
//     connection of its own, one of at most WaitConns (16 by default; past
//     them the Acquire fails at once with dlock.ErrResourceLimit naming
//     wait_conns), and wait in pg_advisory_lock there, in the server's FIFO
//     queue (a try-lock never overtakes its waiters); the lock granted stays
//     on that connection until its release. An Acquire of a name that the
//     Locker found held elsewhere within the last second waits that way at
//     once, without the try, while one of WaitConns is free. Waiting on the server hears the
//     release of every holder (other processes, psql) in order, which a
//     notification sent by this driver's releases would not; moving a granted
//     lock to a shared session would leave it free for a moment.
//   - Expiry: a shared session's idle_session_timeout is the longest TTL of
//     its leases, and any message the server answers on it restarts it for
//     all of them: the driver is a driver.BatchRefresher, and a batch of
//     refreshes is one exchange per session, a Sync message alone (no
//     statement, no transaction: a transaction's end walks every lock its
//     backend holds) unless the timeout must change, then a statement. A process that
//     goes silent thus loses every lease of a session when the server ends
//     it, a TTL after its last statement, not a TTL after each lease's own
//     last refresh; a lease left unrefreshed (refresh=false) in a process
//     that runs on is unlocked on its session by the driver once its TTL
//     has passed, and reported lost.
//   - Loss: the end of a session (a reset, pg_terminate_backend, its
//     expiry) loses exactly the leases on it, each reporting it.
//   - Release unlocks the lease's key on its session (pg_advisory_unlock:
//     a fast-path call for a release alone, one statement for the releases
//     that queued together); fencing tokens are taken as without shared
//     sessions.
//   - A Locker never holds one name twice on one session (its locks would
//     stack): a name it holds on a shared session is busy for its other
//     attempts, which wait on a connection of their own.
//
// The shortest TTL is then SharedMinTTL (500ms), not MinTTL: statements on a
// shared session run one at a time, and a batch's refreshes complete
// together. Statements on a shared session run one at a time; a ctx that ends
// during one returns at once while the statement completes in the
// background (and gives back what it took), since cancelling it would end
// the session and every lease on it. A shared session with no lease goes
// back to the pool, its settings restored, a moment later.
//
// Costs, measured at 10,000 leases of TTL 3s on 2 cores (dlock bench hold,
// November 2026): 4 connections, about 180 refresh exchanges a second (the
// Locker's batches of 256, one Sync per session each), 2.2-2.9s of process
// CPU and 0.3-0.4s of server CPU per minute of holding, none lost (also
// with a busy loop beside it).
//
// Why shared sessions are not the default: measured on one server, taking
// turns with a connection per lease (dlock bench -peers, and 8 Lockers
// acquiring and releasing, load 5-9 on 2 cores), uncontended
// acquire+release and handoff are about equal, but acquisitions cost more
// client CPU: of a contended name 1-22% more per operation (every Acquire
// tried on its shared session first, 70% more, until a busy name waited at
// once), of independent names up to 40% more, at parity to two thirds of
// the rate across runs (not profiled yet: a shared session's statements go
// through its one-at-a-time queue, with a goroutine each when their ctx can
// end, where a dedicated lease's go straight to its connection). And they
// change what a user sees: the shortest TTL is SharedMinTTL rather than
// MinTTL, and more than WaitConns waiting Acquires at once fail with
// dlock.ErrResourceLimit where the pool would have served pool_max_conns.
//
// # Layout
//
// A lock is the advisory lock whose 64-bit key is
//
//	hashtextextended(<KeyPrefix> || <name>, 0)
//
// in the database of the URL (advisory locks are per database). KeyPrefix
// defaults to "", so from psql, connected to the same database,
//
//	SELECT pg_advisory_lock(hashtextextended('jobs/nightly', 0));
//
// takes the lock that dlock takes for the name "jobs/nightly", and excludes
// dlock holders (and is excluded by them) until pg_advisory_unlock or the end
// of the psql session; pg_try_advisory_lock works the same way. The name's
// bytes are hashed in the database encoding (UTF-8 recommended). In pg_locks
// a held lock is the row with locktype 'advisory', classid the key's high 32
// bits, objid its low 32 bits, objsubid 1, and the holder's pid. Two names
// share a lock only if their 64-bit hashes collide (a chance of about
// n²/2^65 among n names): they then exclude each other, which is safe.
//
// The other kinds hash the same key text with other seeds, so that a lock,
// a read/write lock and a semaphore of one name are three objects (the
// string KeyPrefix || name is <text> below):
//
//	read/write lock   hashtextextended(<text>, 1)          readers ShareLock, writers ExclusiveLock
//	semaphore queue   hashtextextended(<text>, 2)          held by the waiting head, awaited by the others
//	permit slot i     (hi32(hs), lo16(hs) << 16 | i)        hs = hashtextextended(<text>, 3), 0 ≤ i < Limit
//	semaphore limit N (hi32(hl), lo16(hl) << 16 | N - 1)    hl = hashtextextended(<text>, 4), shared
//
// A slot and a limit are advisory locks on a pair of int4 keys
// (pg_advisory_lock(int4, int4); objsubid 2 in pg_locks, classid the first
// key, objid the second), where hi32 is the hash's top 32 bits and lo16 the
// 16 below them: a semaphore's keys share their first 48 bits, so pg_locks
// finds all of them in one range (Limit is at most 65536), and two
// semaphores share keys only if those 48 bits collide (about n²/2^49 among
// n names; a semaphore's slots and another's limits, a chance as small).
// The channels are dlock_permit_<queue key in hex> (a permit's release
// notifies it) and dlock_lock_<lock key in hex> (a lease with metadata). So
// from psql,
//
//	SELECT pg_advisory_lock_shared(hashtextextended('cfg', 1));
//
// reads the read/write lock "cfg", excluding dlock writers, and
//
//	SELECT objid::int8 & 65535 AS slot, pid FROM pg_locks
//	WHERE locktype = 'advisory' AND objsubid = 2
//	  AND classid = ((hashtextextended('pool', 3) >> 32) & 4294967295)::oid
//	  AND objid::int8 >> 16 = (hashtextextended('pool', 3) >> 16) & 65535;
//
// lists the held permits of the semaphore "pool".
//
// Nothing else is stored but the fencing sequence and epoch table (see
// Guarantees) and the metadata of leases that have some (dlock_metadata):
// no lease leaves anything on the server once its session ends but, after
// a crash, its metadata row, which nothing reads and the next metadata
// grant deletes.
//
// Task queue (package queue, postgres.NewQueue or queue.Open with a
// postgres URL): one table, dlock_tasks by default (QueueOptions.Table, URL
// queue_table), created on first use, with one index; tasks.sql is its DDL
// for administrators who create it themselves. Every operation is one
// statement (Claim and Pop make expired claims due again in the same one).
// Wake-ups are NOTIFYs on the channel dlock_tasks with the queue's name as
// payload, sent in a transaction of their own after a change that made a
// task due (Enqueue, Nack, Requeue), and only when some Client is
// listening on the table: PostgreSQL serialises the commits of notifying
// transactions, and that NOTIFY is most of what an Enqueue costs beyond a
// bare INSERT (about 0.65× its throughput with 8 writers, against 0.85×
// without). A change learns whether anyone listens from two advisory locks
// on bigint keys (objsubid 1 in pg_locks, distinct from every lock kind's
// keys), where <table> is the table's name as configured:
//
//	waiters  hashtextextended('<table>', 5)   held shared by each Client's listening connection
//	barrier  hashtextextended('<table>', 6)   shared by each change to its commit; exclusive, for a moment, by a new listener
//
// A change takes the barrier, tests the waiters key with a try-lock that it
// drops at once, and notifies when the key was held; a new listener LISTENs,
// takes the waiters key, then takes and drops the barrier before its first
// look, so that a change it was too late to be told of has committed by
// then (tasks.go has the argument; no wake-up is lost). So from psql,
//
//	LISTEN dlock_tasks;
//	SELECT pg_advisory_lock_shared(hashtextextended('dlock_tasks', 5));
//	SELECT pg_advisory_lock(hashtextextended('dlock_tasks', 6)), pg_advisory_unlock(hashtextextended('dlock_tasks', 6));
//
// hears every later enqueue on the default table; a LISTEN alone hears only
// what changes make while some Client waits. A waiting Claim's wait for
// the next due time is counted in microseconds from when its statement was
// sent, and its last 1.5ms is slept in the kernel rather than on a Go timer
// (which may fire up to a millisecond late; tasks_due.go), so that the next
// Claim reaches the server as the task becomes due.
package postgres
