package pgqueue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/postgres"
	"github.com/dlock/dlock/queue"
	qdriver "github.com/dlock/dlock/queue/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	qdriver.Register("postgres", openTasks)
	qdriver.Register("postgresql", openTasks)
}

//go:embed tasks.sql
var tasksDDL string

// DefaultQueueTable is the task-queue table's name (QueueOptions.Table).
const DefaultQueueTable = "dlock_tasks"

// notifyChannel is the LISTEN/NOTIFY channel of wake-ups; the payload is
// the queue's name.
const notifyChannel = "dlock_tasks"

// QueueOptions configure a task-queue Client.
type QueueOptions struct {
	// Table is the table's name, optionally schema-qualified ("jobs.tasks"),
	// created on first use when missing (URL: queue_table). Default
	// DefaultQueueTable.
	Table string
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$`)

// NewQueue returns a task-queue Client (package queue) on the
// application's pool: every operation is one statement (and a NOTIFY after
// it when it made a task due while a Client was waiting on the table);
// waiting Claims are woken by LISTEN/NOTIFY on one connection of the pool,
// held while someone waits. Closing the Client does not close the pool.
func NewQueue(pool *pgxpool.Pool, opts *QueueOptions) (*queue.Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool", dlock.ErrInvalid)
	}
	d, err := newTaskDriver(pool, opts, false)
	if err != nil {
		return nil, err
	}
	return queue.New(d), nil
}

func openTasks(ctx context.Context, u *url.URL) (qdriver.Driver, error) {
	q := u.Query()
	table := q.Get("queue_table")
	q.Del("queue_table")
	rest := *u
	rest.RawQuery = q.Encode()
	cfg, _, err := postgres.ParseURL(&rest)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: opening %s: %w", dlockdriver.RedactURL(u), err)
	}
	d, err := newTaskDriver(pool, &QueueOptions{Table: table}, true)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return d, nil
}

func newTaskDriver(pool *pgxpool.Pool, opts *QueueOptions, owns bool) (*taskDriver, error) {
	table := DefaultQueueTable
	if opts != nil && opts.Table != "" {
		table = opts.Table
	}
	if !identRE.MatchString(table) {
		return nil, fmt.Errorf("%w: postgres: queue table %q: want a lower-case identifier, optionally schema-qualified", dlock.ErrInvalid, table)
	}
	d := &taskDriver{pool: pool, owns: owns, table: table, watchers: map[string]map[chan struct{}]struct{}{}}
	d.sql = strings.NewReplacer("dlock_tasks", table)
	d.enqueueSQL = d.q(enqueueSQL)
	d.peekSQL, d.popSQL, d.claimSQL = d.q(takeSQL(peekOp)), d.q(takeSQL(popOp)), d.q(takeSQL(claimOp))
	return d, nil
}

type taskDriver struct {
	pool  *pgxpool.Pool
	owns  bool
	table string
	sql   *strings.Replacer

	// The statements of the hot paths, with the table's name in place.
	enqueueSQL, peekSQL, popSQL, claimSQL string

	ddlMu sync.Mutex
	ddlOK bool

	due dueWakes // the due times of waiting Claims and Pops (due.go)

	wmu      sync.Mutex
	watchers map[string]map[chan struct{}]struct{} // by queue
	listener *pgxpool.Conn                         // LISTENing while someone watches
	stopL    context.CancelFunc
	linger   *time.Timer
	lwg      sync.WaitGroup
	closed   bool
}

func (d *taskDriver) Ping(ctx context.Context) error { return d.ensure(ctx) }

// ensure creates the table when missing, once per driver. It asks the
// catalog first and runs the DDL only when the table or its index is
// missing: CREATE INDEX IF NOT EXISTS takes a SHARE lock on the table before
// it finds the index there, which waits for every writing transaction and
// holds every later one up behind it (new Clients, each asking once with
// a short ctx, kept the table's writers waiting so). Clients creating the
// table at once would collide ("relation already exists", or a unique
// violation in the catalog), so the DDL runs under an advisory lock of the
// table's (ddlKey), held to its commit: the statements are one implicit
// transaction.
func (d *taskDriver) ensure(ctx context.Context) error {
	d.ddlMu.Lock()
	defer d.ddlMu.Unlock()
	if d.ddlOK {
		return nil
	}
	var exists bool
	err := d.pool.QueryRow(ctx, d.q(`SELECT to_regclass('dlock_tasks') IS NOT NULL AND to_regclass('dlock_tasks_state_due') IS NOT NULL`)).Scan(&exists)
	if err == nil && !exists {
		_, err = d.pool.Exec(ctx, d.q(`SELECT pg_advisory_xact_lock(`+ddlKey+`);`)+d.q(tasksDDL))
	}
	if err != nil {
		return fmt.Errorf("postgres: creating the task table %s: %w", d.table, err)
	}
	d.ddlOK = true
	return nil
}

// dueExpr is what a due time or deadline is counted from: the statement's
// now() rounded up to the millisecond (now() is to the µs), with durations
// the client rounded up (qdriver.Millis), so that it is never earlier than
// the client's belief, counted from before it sent the statement (see
// package queue/driver's Rounding). Whether one has passed is asked of
// now() unrounded.
const dueExpr = `date_trunc('milliseconds', now() + interval '999 microseconds')`

// dueAfter is the due time of a task due the parameter's ms after now:
// dueExpr plus them, or, for no delay, now() rounded down: due at once.
func dueAfter(ms string) string {
	return `CASE WHEN ` + ms + ` = 0 THEN date_trunc('milliseconds', now()) ELSE ` +
		dueExpr + ` + ` + ms + ` * interval '1 millisecond' END`
}

func (d *taskDriver) q(s string) string { return d.sql.Replace(s) }

func (d *taskDriver) Enqueue(ctx context.Context, qn string, r qdriver.EnqueueRequest) (qdriver.Result, error) {
	var at *int64
	if !r.At.IsZero() {
		v := qdriver.UpMilli(r.At).UnixMilli()
		at = &v
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{}
	}
	if err := d.ensure(ctx); err != nil {
		return 0, err
	}
	var (
		changed, inserted *bool
		old               *int16
		waiters           bool
	)
	err := d.pool.QueryRow(ctx, d.enqueueSQL, qn, r.ID, qdriver.Millis(r.Delay), at, payload, int(r.Mode)).
		Scan(&changed, &inserted, &old, &waiters)
	if err != nil {
		return 0, fmt.Errorf("postgres: enqueue on %q: %w", qn, err)
	}
	if changed == nil {
		return qdriver.Kept, nil
	}
	if waiters {
		if err := d.notify(ctx, qn); err != nil {
			return 0, fmt.Errorf("postgres: enqueue on %q: the task is queued, but waking its waiters failed: %w", qn, err)
		}
	}
	switch {
	case *inserted || (old != nil && *old == 2):
		return qdriver.Added, nil
	case r.Mode == qdriver.Replace:
		return qdriver.Replaced, nil
	default:
		return qdriver.Rescheduled, nil
	}
}

// enqueueSQL inserts the task ($1 queue, $2 id, $3 delay or $4 time in ms,
// $5 payload) or, when it is queued, leaves it ($6 Keep) or replaces ($6
// Replace) or reschedules it; a dead task is queued afresh whatever $6
// says.
// It returns whether a row changed, whether it was inserted, the task's
// state before (from the statement's snapshot: it only names the result),
// and whether a Client may be waiting (see waitersTest): the insert reads
// its row from w, so the test is done before the statement locks a row.
var enqueueSQL = `WITH w AS MATERIALIZED (SELECT ` + waitersTest + ` AS waiters),
	old AS (SELECT state FROM dlock_tasks WHERE queue = $1 AND id = $2),
	up AS (INSERT INTO dlock_tasks AS t (queue, id, state, due, payload)
		SELECT $1, $2, 0, COALESCE('epoch'::timestamptz + $4::bigint * interval '1 millisecond',
		        ` + dueAfter("$3::bigint") + `), $5 FROM w
		ON CONFLICT (queue, id) DO UPDATE SET
		  state = 0, token = NULL, due = excluded.due,
		  payload = CASE WHEN $6::int = 1 OR t.state = 2 THEN excluded.payload ELSE t.payload END,
		  attempts = CASE WHEN t.state = 2 THEN 0 ELSE t.attempts END
		WHERE $6::int <> 0 OR t.state = 2
		RETURNING xmax = 0 AS inserted)
	SELECT (SELECT true FROM up), (SELECT inserted FROM up), (SELECT state FROM old), (SELECT waiters FROM w)`

// takeSQL runs an operation on a queue's due tasks as one statement, with
// the recovery of expired claims before it ($1 queue, $3 maxAttempts): each
// expired claim becomes due again at its deadline, or dead when $3 > 0 and
// it has had $3 deliveries. op is one or more CTEs, the last named op
// returning (id, due_ms, attempts, payload, token). The statement returns op's rows, each with the
// number of claims recovered; when op has none, one row of NULLs with the
// time in µs from the statement's now() until the next due task or claim
// expiry (NULL when there is none) instead: due times are to the ms, but a
// wait rounded to the ms would wake a waiter up to half a ms early, for
// nothing, or late. Recovered tasks are not visible to op (one snapshot):
// the caller runs it again when it took fewer than it asked for and some
// were recovered.
//
// The recovery locks its rows as op does, FOR UPDATE SKIP LOCKED, and never
// waits for a row: a row another statement holds is that statement's to
// recover (or to ack, extend or nack), and this one, seeing it expired in
// its snapshot, reports a wait of 0 and its caller asks again. Recovering
// with a plain UPDATE made every waiting Claim queue up behind the others'
// row locks on the same expired claims, taken in the order of each one's
// plan, so that two of them deadlocked, each held until PostgreSQL's
// deadlock check (deadlock_timeout, 1s) aborted one: with 8 waiting
// workers, expired claims were recovered at about one a second.
func takeSQL(op string) string {
	return `WITH exp AS MATERIALIZED (SELECT id FROM dlock_tasks
	  WHERE queue = $1 AND state = 1 AND due <= now() FOR UPDATE SKIP LOCKED),
	rec AS (UPDATE dlock_tasks t SET token = NULL,
	  state = CASE WHEN $3::int > 0 AND t.attempts >= $3::int THEN 2 ELSE 0 END,
	  due = CASE WHEN $3::int > 0 AND t.attempts >= $3::int THEN date_trunc('milliseconds', now()) ELSE t.due END
	  FROM exp WHERE t.queue = $1 AND t.id = exp.id RETURNING 1),
	` + op + `
	SELECT id, due_ms, attempts, payload, token, NULL::bigint, (SELECT count(*) FROM rec) FROM op
	UNION ALL
	SELECT NULL, NULL, NULL, NULL, NULL, (extract(epoch from (LEAST(
	  (SELECT min(due) FROM dlock_tasks WHERE queue = $1 AND state = 0),
	  (SELECT min(due) FROM dlock_tasks WHERE queue = $1 AND state = 1)) - now())) * 1000000)::bigint,
	  (SELECT count(*) FROM rec)
	WHERE NOT EXISTS (SELECT 1 FROM op)`
}

// untilDue turns a wait the server counted from its now() into one counted
// from the caller's now: the server took now() when the statement reached
// it, a moment after sent, and the statement that the wait's end starts
// takes as long to reach it. So the wait is counted from sent, and that
// next statement arrives as the task becomes due, not a reply's journey
// after (a wait counted from the reply's arrival has its sender wake
// about a round trip late). It is never negative.
func untilDue(wait time.Duration, sent time.Time) time.Duration {
	return max(wait-time.Since(sent), 0)
}

type row struct {
	id       string
	due      int64
	attempts int
	payload  []byte
	token    *string
}

// readRows reads takeSQL's result: the rows in due order, the wait (-1
// for none; only when there are no rows) and the number of claims
// recovered.
func readRows(rows pgx.Rows) ([]row, time.Duration, int64, error) {
	var (
		out       []row
		wait      = time.Duration(-1)
		recovered int64
	)
	for rows.Next() {
		var (
			r      row
			id     *string
			due, w *int64
			att    *int32
		)
		if err := rows.Scan(&id, &due, &att, &r.payload, &r.token, &w, &recovered); err != nil {
			rows.Close()
			return nil, 0, 0, err
		}
		if id == nil {
			if w != nil {
				wait = time.Duration(max(*w, 0)) * time.Microsecond
			}
			continue
		}
		r.id, r.due, r.attempts = *id, *due, int(*att)
		out = append(out, r)
	}
	rows.Close()
	slices.SortFunc(out, func(a, b row) int {
		if a.due != b.due {
			return int(a.due - b.due)
		}
		return strings.Compare(a.id, b.id)
	})
	return out, wait, recovered, rows.Err()
}

func (r row) task() qdriver.Task {
	return qdriver.Task{ID: r.id, Due: time.UnixMilli(r.due), Payload: r.payload, Attempts: r.attempts}
}

// take runs takeSQL(op) with args ($1 queue, $2 n, $3 maxAttempts, then
// op's own), once more when claims were recovered and fewer than n taken.
func (d *taskDriver) take(ctx context.Context, qn, what string, stmt string, args ...any) ([]row, time.Duration, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, 0, err
	}
	waits := what != "peek"
	if waits {
		d.due.await(qn)
	}
	var out []row
	for {
		if err := ctx.Err(); err != nil {
			if len(out) > 0 {
				return out, 0, nil // taken: the caller gets them
			}
			return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
		}
		mark := d.due.mark()
		sent := time.Now()
		sctx, stop := statementContext(ctx)
		rows, err := d.pool.Query(sctx, stmt, args...)
		var (
			got       []row
			wait      time.Duration
			recovered int64
		)
		if err == nil {
			got, wait, recovered, err = readRows(rows)
		}
		stop()
		if err != nil {
			if waits {
				// This waiter may have been the one woken for a task
				// it did not take: another looks.
				d.wmu.Lock()
				d.wakeOne(qn)
				d.wmu.Unlock()
			}
			if len(out) > 0 {
				return out, 0, nil // taken by the run before: the caller gets them
			}
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, context.Canceled) {
				// Cut off statementGrace after the caller's ctx ended:
				// the caller's error (DeadlineExceeded) is the cause.
				err = fmt.Errorf("%w (the statement was cancelled %v after it)", cerr, statementGrace)
			}
			return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
		}
		out = append(out, got...)
		if recovered == 0 || len(got) == 0 && wait != 0 || len(got) >= args[1].(int) {
			if wait > 0 {
				wait = untilDue(wait, sent)
				if waits && wait > 0 {
					wait = d.due.report(qn, wait, mark)
				}
			}
			return out, wait, nil
		}
		args[1] = args[1].(int) - len(got)
	}
}

// statementGrace is how long a statement already sent may run on after its
// caller's ctx ended.
const statementGrace = time.Second

// statementContext is the context a taking statement runs under: the
// caller's values, but its end only statementGrace later. A statement cut
// off mid-flight costs its connection (pgx closes it, and a new one must
// be opened, which on a loaded server takes longer than the short waits
// of workers that claim in a loop: the pool churned through 201 sessions
// in one 90 s run), and rows it has already deleted or claimed on the
// server would reach nobody. A statement takes milliseconds, so the grace
// is rarely used; a server that does not answer still ends the call
// statementGrace after ctx.
func statementContext(ctx context.Context) (context.Context, func()) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer *time.Timer
	var mu sync.Mutex
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(statementGrace, cancel)
	})
	return sctx, func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// The operations on due tasks, for takeSQL: $2 is n, $4 the claim token's
// prefix, $5 the visibility in ms. Pop and Claim pick their rows (c) in a
// MATERIALIZED CTE, evaluated once, and change the rows whose ids are in
// ARRAY(SELECT id FROM c), an InitPlan, also evaluated once: the change
// joins nothing, so no plan can take more than the n rows picked. (The
// pick was once a subquery joined to the table: with stale statistics (a
// fresh table, or right after a burst) it was planned as the inner side
// of a nested loop, run again for each queued row, each run passing over
// the rows the statement had already changed and picking the next ones:
// Pop(3) took 4 tasks, ClaimWait(10) up to 276.) Claim joins its updated
// rows back to c, both at most n rows with distinct ids, for the due
// times they had.
const (
	peekOp = `op AS (SELECT id, (extract(epoch from due) * 1000)::bigint AS due_ms, attempts, payload, token FROM dlock_tasks
		WHERE queue = $1 AND state = 0 AND due <= now() ORDER BY due, id LIMIT $2)`
	pickDue = `c AS MATERIALIZED (SELECT id, due FROM dlock_tasks WHERE queue = $1 AND state = 0 AND due <= now()
		  ORDER BY due, id LIMIT $2 FOR UPDATE SKIP LOCKED),`
	popOp = pickDue + `
		op AS (DELETE FROM dlock_tasks t WHERE t.queue = $1 AND t.id = ANY(ARRAY(SELECT id FROM c))
		RETURNING t.id, (extract(epoch from t.due) * 1000)::bigint AS due_ms, t.attempts, t.payload, t.token)`
	claimOp = pickDue + `
		u AS (UPDATE dlock_tasks t SET state = 1, attempts = t.attempts + 1,
		  token = $4 || ':' || t.id, due = ` + dueExpr + ` + $5::bigint * interval '1 millisecond'
		WHERE t.queue = $1 AND t.id = ANY(ARRAY(SELECT id FROM c))
		RETURNING t.id, t.attempts, t.payload, t.token),
		op AS (SELECT u.id, (extract(epoch from c.due) * 1000)::bigint AS due_ms, u.attempts, u.payload, u.token
		FROM u JOIN c ON c.id = u.id)`
	// releaseSQL gives back a claim Claim took beyond its n ($1 queue,
	// $2 id, $3 token, $4 the due time it had in ms), as if never
	// claimed.
	releaseSQL = `UPDATE dlock_tasks SET state = 0, token = NULL, attempts = attempts - 1,
		due = 'epoch'::timestamptz + $4::bigint * interval '1 millisecond'
		WHERE queue = $1 AND id = $2 AND state = 1 AND token = $3`
)

func (d *taskDriver) Peek(ctx context.Context, qn string, n int) ([]qdriver.Task, error) {
	rows, _, err := d.take(ctx, qn, "peek", d.peekSQL, qn, n, 0)
	return tasksOf(rows), err
}

func tasksOf(rows []row) []qdriver.Task {
	out := make([]qdriver.Task, len(rows))
	for i, r := range rows {
		out[i] = r.task()
	}
	return out
}

func (d *taskDriver) Pop(ctx context.Context, qn string, n int) ([]qdriver.Task, time.Duration, error) {
	rows, w, err := d.take(ctx, qn, "pop", d.popSQL, qn, n, 0)
	return tasksOf(rows), w, err
}

func (d *taskDriver) Claim(ctx context.Context, qn string, n int, vis time.Duration, max int) ([]qdriver.Claimed, time.Duration, error) {
	rows, w, err := d.take(ctx, qn, "claim", d.claimSQL, qn, n, max, qdriver.NewToken(), qdriver.Millis(vis))
	if len(rows) > n {
		// Never more than n, whatever the plan: the statement cannot
		// take more (claimOp), but should it, the extra claims are
		// given back at once (or, if that fails, run out and are
		// delivered again).
		for _, r := range rows[n:] {
			_, _ = d.execDue(ctx, "claim", qn, releaseSQL, qn, r.id, *r.token, r.due)
		}
		rows = rows[:n]
	}
	out := make([]qdriver.Claimed, len(rows))
	for i, r := range rows {
		out[i] = qdriver.Claimed{Task: r.task(), Token: *r.token}
	}
	return out, w, err
}

// current is the condition of a current claim: $1 queue, $2 id, $3 token.
// The row is found through the primary key, (queue, id): state is
// compared as an int (state::int, not the indexed smallint), so that the
// (queue, state, due, id) index offers no range but the whole queue. With
// state = 1, the planner (with stale statistics, and a tie in cost) walked
// that index through every live claim of the queue, and the dead entries
// of those acked within the last visibility, for each Ack: 4.3ms an Ack
// beside 5,000 live claims, 0.1ms through the key (BenchmarkAck).
const current = `queue = $1 AND id = $2 AND state::int = 1 AND token = $3 AND due > now()`

// Wake-ups go only where someone may be waiting. A NOTIFY costs its
// sender a transaction, and PostgreSQL serialises the commits of notifying
// transactions; so a change that makes a task due notifies only when some
// Client is listening on the table, which the change learns from two
// advisory locks (bigint keys, in the table's database; see queue/DESIGN.md,
// PostgreSQL):
//
//   - waitersKey: every Client's listening connection holds it shared for
//     as long as it listens, taken after its LISTEN has committed;
//   - barrierKey: each change that may make a task due takes it shared as a
//     transaction lock, first thing in its statement, held to its commit;
//     a listening connection, once it holds waitersKey, takes it exclusive
//     and drops it at once (a barrier) before its Client's first look at
//     the table.
//
// The change tests waitersKey, after taking barrierKey, with an exclusive
// try-lock that it drops at once (a session lock held for microseconds, so
// that listeners are not kept out for the change's commit and two changes'
// tests seldom meet; when they do, the loser believes someone waits and
// sends a NOTIFY for nothing). It NOTIFYs after its commit only when the
// test found waitersKey held. No wake-up is lost: take a listener L and a
// change C.
//
//   - L took waitersKey before C's test: C finds it held and notifies after
//     its commit, and L, listening since before it took the key, hears it;
//     the waiters that Watch registers on L look at the table after
//     registering, so each either sees C's task or is signalled.
//   - L took waitersKey after C's test: C already held barrierKey, to its
//     commit, so L's barrier waits for C's commit (or rollback), and L's
//     Client looks at the table only after the barrier: it sees C's task.
//
// So a waiter registered with a listener sees every change committed before
// its look, and is notified of every later one. A listener that goes away
// (its connection closes, or it is stopped with nobody waiting) drops the
// key with its session; its Client's waiters are signalled then, as before.
// Clients of an older dlock, which LISTEN without holding waitersKey, are
// not notified (they still wake at the next due time they know of, or
// after queue's longest wait).
const (
	waitersKey = `hashtextextended('dlock_tasks', 5)`
	barrierKey = `hashtextextended('dlock_tasks', 6)`
	// ddlKey serialises the creation of the table (ensure).
	ddlKey = `hashtextextended('dlock_tasks', 7)`
	// waitersTest takes barrierKey for the transaction, then tests
	// waitersKey: true when some session holds it (a listener, or another
	// change testing it at that instant). CASE evaluates in order.
	waitersTest = `CASE WHEN pg_advisory_xact_lock_shared(` + barrierKey + `) IS NULL THEN NULL
		WHEN pg_try_advisory_lock(` + waitersKey + `) THEN NOT pg_advisory_unlock(` + waitersKey + `)
		ELSE true END`
	// listenSQL registers a listening connection, after its LISTEN has
	// committed: waitersKey shared for the session, then the barrier.
	listenSQL = `WITH f AS MATERIALIZED (SELECT pg_advisory_lock_shared(` + waitersKey + `)),
		b AS MATERIALIZED (SELECT pg_advisory_lock(` + barrierKey + `) FROM f)
		SELECT pg_advisory_unlock(` + barrierKey + `) FROM b`
	// unlistenSQL undoes LISTEN and listenSQL before the connection goes
	// back to the pool.
	unlistenSQL = `UNLISTEN *; SELECT pg_advisory_unlock_shared(` + waitersKey + `)`
)

// notify wakes the waiters on the queue, after the change that made a task
// due has committed. It is a transaction of its own: NOTIFY takes a lock
// that serialises the commits of notifying transactions, and a transaction
// that writes no data commits without waiting for the WAL to be flushed,
// so that lock is held for a moment, not across the change's flush.
func (d *taskDriver) notify(ctx context.Context, qn string) error {
	_, err := d.pool.Exec(ctx, `SELECT pg_notify('`+notifyChannel+`', $1)`, qn)
	return err
}

// exec runs stmt, which changes at most one row, and says whether it did.
func (d *taskDriver) exec(ctx context.Context, what, qn string, stmt string, args ...any) (bool, error) {
	if err := d.ensure(ctx); err != nil {
		return false, err
	}
	tag, err := d.pool.Exec(ctx, d.q(stmt), args...)
	if err != nil {
		return false, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	return tag.RowsAffected() == 1, nil
}

// execDue runs update, an UPDATE of at most one row that makes a task due,
// with waitersTest before it, and wakes the queue's ($1) waiters when it
// changed the row and someone may be waiting. update ends with its WHERE
// clause: the test is added to it, so that it runs before a row is locked.
func (d *taskDriver) execDue(ctx context.Context, what, qn string, update string, args ...any) (bool, error) {
	if err := d.ensure(ctx); err != nil {
		return false, err
	}
	var (
		changed int64
		waiters bool
	)
	err := d.pool.QueryRow(ctx, d.q(`WITH w AS MATERIALIZED (SELECT `+waitersTest+` AS waiters),
		u AS (`+update+` AND (SELECT true FROM w) RETURNING 1)
		SELECT (SELECT count(*) FROM u), (SELECT waiters FROM w)`), args...).Scan(&changed, &waiters)
	if err != nil {
		return false, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	if changed == 1 && waiters {
		if err := d.notify(ctx, qn); err != nil {
			return true, fmt.Errorf("postgres: %s on %q: done, but waking the queue's waiters failed: %w", what, qn, err)
		}
	}
	return changed == 1, nil
}

func (d *taskDriver) Ack(ctx context.Context, qn, id, token string) (bool, error) {
	return d.exec(ctx, "ack", qn, `DELETE FROM dlock_tasks WHERE `+current, qn, id, token)
}

func (d *taskDriver) Extend(ctx context.Context, qn, id, token string, ext time.Duration) (bool, error) {
	return d.exec(ctx, "extend", qn, `UPDATE dlock_tasks SET due = `+dueExpr+` + $4::bigint * interval '1 millisecond' WHERE `+current,
		qn, id, token, qdriver.Millis(ext))
}

func (d *taskDriver) Nack(ctx context.Context, qn, id, token string, delay time.Duration, max int) (bool, error) {
	return d.execDue(ctx, "nack", qn, `UPDATE dlock_tasks SET token = NULL,
		state = CASE WHEN $5::int > 0 AND attempts >= $5::int THEN 2 ELSE 0 END,
		due = CASE WHEN $5::int > 0 AND attempts >= $5::int THEN date_trunc('milliseconds', now()) ELSE `+dueAfter("$4::bigint")+` END
		WHERE `+current, qn, id, token, qdriver.Millis(delay), max)
}

func (d *taskDriver) Delete(ctx context.Context, qn, id string, due time.Time) (bool, error) {
	return d.exec(ctx, "delete", qn, `DELETE FROM dlock_tasks WHERE queue = $1 AND id = $2 AND state = 0
		AND due = 'epoch'::timestamptz + $3::bigint * interval '1 millisecond'`, qn, id, qdriver.UpMilli(due).UnixMilli())
}

func (d *taskDriver) Requeue(ctx context.Context, qn, id string, delay time.Duration) (bool, error) {
	return d.execDue(ctx, "requeue", qn, `UPDATE dlock_tasks SET state = 0, attempts = 0, token = NULL,
		due = `+dueAfter("$3::bigint")+` WHERE queue = $1 AND id = $2 AND state = 2`, qn, id, qdriver.Millis(delay))
}

func (d *taskDriver) Stats(ctx context.Context, qn string) (qdriver.Stats, error) {
	if err := d.ensure(ctx); err != nil {
		return qdriver.Stats{}, err
	}
	var s qdriver.Stats
	err := d.pool.QueryRow(ctx, d.q(`SELECT
		count(*) FILTER (WHERE (state = 0 AND due <= now()) OR (state = 1 AND due <= now())),
		count(*) FILTER (WHERE state = 0 AND due > now()),
		count(*) FILTER (WHERE state = 1 AND due > now()),
		count(*) FILTER (WHERE state = 2)
		FROM dlock_tasks WHERE queue = $1`), qn).Scan(&s.Due, &s.Delayed, &s.Claimed, &s.Dead)
	if err != nil {
		return s, fmt.Errorf("postgres: stats of %q: %w", qn, err)
	}
	return s, nil
}

func (d *taskDriver) Dead(ctx context.Context, qn string, n int) ([]qdriver.Task, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, d.q(`SELECT id, (extract(epoch from due) * 1000)::bigint, attempts, payload, token,
		NULL::bigint, 0::bigint FROM dlock_tasks WHERE queue = $1 AND state = 2 ORDER BY due, id LIMIT $2`), qn, n)
	if err != nil {
		return nil, fmt.Errorf("postgres: dead letters of %q: %w", qn, err)
	}
	out, _, _, err := readRows(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: dead letters of %q: %w", qn, err)
	}
	return tasksOf(out), nil
}

// Watch registers a waiter for the queue's wake-ups: the Client's listening
// connection (one, taken from the pool while anyone waits) LISTENs on the
// channel and then registers with listenSQL (see waitersKey), and a
// notification with the queue's name signals one waiter of that queue
// (wakeOne).
// A listening connection that fails wakes every waiter (a notification may
// have been missed) and is replaced at the next Watch.
func (d *taskDriver) Watch(ctx context.Context, qn string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.closed {
		return nil, nil, dlock.ErrClosed
	}
	if d.listener == nil {
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("postgres: a connection to LISTEN on: %w", err)
		}
		if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
			conn.Release()
			return nil, nil, fmt.Errorf("postgres: LISTEN: %w", err)
		}
		// LISTEN has committed (a statement of its own): now the key
		// that says so, and the barrier.
		if _, err := conn.Exec(ctx, d.q(listenSQL)); err != nil {
			// The session may hold waitersKey: it goes with the
			// connection, not back to the pool.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			return nil, nil, fmt.Errorf("postgres: registering the listening connection: %w", err)
		}
		lctx, cancel := context.WithCancel(context.Background())
		d.listener, d.stopL = conn, cancel
		d.lwg.Add(1)
		go d.listen(lctx, conn)
	}
	if d.watchers[qn] == nil {
		d.watchers[qn] = map[chan struct{}]struct{}{}
	}
	d.watchers[qn][c] = struct{}{}
	var once sync.Once
	return c, func() { once.Do(func() { d.unwatch(qn, c) }) }, nil
}

// listenLinger is how long the listening connection stays after the last
// waiter left, so that waits in a loop cost no LISTEN each.
const listenLinger = 2 * time.Second

func (d *taskDriver) unwatch(qn string, c chan struct{}) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	delete(d.watchers[qn], c)
	select {
	case <-c: // a wake-up this waiter did not act on: another's
		d.wakeOne(qn)
	default:
	}
	if len(d.watchers[qn]) == 0 {
		delete(d.watchers, qn)
	}
	if len(d.watchers) > 0 || d.listener == nil {
		return
	}
	conn := d.listener
	if d.linger != nil {
		d.linger.Stop()
	}
	d.linger = time.AfterFunc(listenLinger, func() {
		d.wmu.Lock()
		defer d.wmu.Unlock()
		if len(d.watchers) == 0 && d.listener == conn {
			// Nobody waits: give the connection back.
			d.stopL()
			d.listener, d.stopL = nil, nil
		}
	})
}

// listen delivers notifications until ctx ends or the connection fails,
// then gives the connection back (or, if it failed, destroys it).
func (d *taskDriver) listen(ctx context.Context, conn *pgxpool.Conn) {
	defer d.lwg.Done()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			d.wmu.Lock()
			if d.listener == conn {
				d.listener, d.stopL = nil, nil
			}
			d.due.signalled()
			for _, ws := range d.watchers {
				for c := range ws {
					signal(c)
				}
			}
			d.wmu.Unlock()
			if ctx.Err() != nil {
				// Stopped: UNLISTEN and drop waitersKey before the
				// connection goes back.
				uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, uerr := conn.Exec(uctx, d.q(unlistenSQL))
				cancel()
				if uerr == nil {
					conn.Release()
					return
				}
			}
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			return
		}
		d.wmu.Lock()
		d.wakeOne(n.Payload)
		d.wmu.Unlock()
	}
}

// wakeOne signals one waiter of the queue, one not signalled yet, for a
// notification: each notification is one change that made a task due, and
// one waiter takes it. Waking them all had every idle waiter run a Claim
// for each task, all but one for nothing (8 idle workers: 42 transactions
// per task). When every waiter has a signal pending, all are awake and
// each will look. A waiter that leaves with its signal unread passes it on
// (unwatch), and so does one whose statement failed (take). d.wmu is
// held.
func (d *taskDriver) wakeOne(qn string) {
	for c := range d.watchers[qn] {
		if len(c) == 0 {
			d.due.signalled() // before the waiter can look
			signal(c)
			return
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (d *taskDriver) Close() error {
	d.wmu.Lock()
	d.closed = true
	stop := d.stopL
	d.listener, d.stopL = nil, nil
	if d.linger != nil {
		d.linger.Stop()
	}
	d.wmu.Unlock()
	if stop != nil {
		stop()
	}
	d.lwg.Wait()
	if d.owns {
		d.pool.Close()
	}
	return nil
}
