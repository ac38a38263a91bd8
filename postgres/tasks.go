package postgres

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
	"github.com/dlock/dlock/queue"
	qdriver "github.com/dlock/dlock/queue/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// application's pool: every operation is one statement or one batch run as
// one implicit transaction; waiting Claims are woken by LISTEN/NOTIFY on
// one connection of the pool, held while someone waits. Closing the Client
// does not close the pool.
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
	cfg, _, err := ParseURL(&rest)
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
		return nil, invalid("queue table %q: want a lower-case identifier, optionally schema-qualified", table)
	}
	d := &taskDriver{pool: pool, owns: owns, table: table, watchers: map[string]map[chan struct{}]struct{}{}}
	d.sql = strings.NewReplacer("dlock_tasks", table)
	return d, nil
}

type taskDriver struct {
	pool  *pgxpool.Pool
	owns  bool
	table string
	sql   *strings.Replacer

	ddlMu sync.Mutex
	ddlOK bool

	wmu      sync.Mutex
	watchers map[string]map[chan struct{}]struct{} // by queue
	listener *pgxpool.Conn                         // LISTENing while someone watches
	stopL    context.CancelFunc
	linger   *time.Timer
	lwg      sync.WaitGroup
	closed   bool
}

func (d *taskDriver) Ping(ctx context.Context) error { return d.ensure(ctx) }

// ensure creates the table when missing, once.
func (d *taskDriver) ensure(ctx context.Context) error {
	d.ddlMu.Lock()
	defer d.ddlMu.Unlock()
	if d.ddlOK {
		return nil
	}
	var err error
	for range 3 { // concurrent CREATE ... IF NOT EXISTS may collide
		if _, err = d.pool.Exec(ctx, d.sql.Replace(tasksDDL)); err == nil {
			d.ddlOK = true
			return nil
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23505" {
			break
		}
	}
	return fmt.Errorf("postgres: creating the task table %s: %w", d.table, err)
}

// batch runs the statements as one implicit transaction (one round trip)
// and returns its results to read in order.
func (d *taskDriver) batch(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	return d.pool.SendBatch(ctx, b), nil
}

const (
	dueExpr   = `date_trunc('milliseconds', now())`
	msOf      = `(extract(epoch from %s) * 1000)::bigint`
	notifySQL = `SELECT pg_notify('` + notifyChannel + `', $1)`
)

func (d *taskDriver) q(s string) string { return d.sql.Replace(s) }

func (d *taskDriver) Enqueue(ctx context.Context, qn string, r qdriver.EnqueueRequest) (qdriver.Result, error) {
	var at *int64
	if !r.At.IsZero() {
		v := r.At.UnixMilli()
		at = &v
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{}
	}
	b := &pgx.Batch{}
	b.Queue(d.q(`DELETE FROM dlock_tasks WHERE queue = $1 AND id = $2 AND state = 2`), qn, r.ID)
	b.Queue(d.q(`INSERT INTO dlock_tasks AS t (queue, id, state, due, payload)
		VALUES ($1, $2, 0, COALESCE('epoch'::timestamptz + $4::bigint * interval '1 millisecond',
		        date_trunc('milliseconds', now()) + $3::bigint * interval '1 millisecond'), $5)
		ON CONFLICT (queue, id) DO UPDATE SET
		  state = 0, token = NULL, due = excluded.due,
		  payload = CASE WHEN $6::int = 1 THEN excluded.payload ELSE t.payload END
		WHERE $6::int <> 0
		RETURNING xmax = 0`), qn, r.ID, r.Delay.Milliseconds(), at, payload, int(r.Mode))
	b.Queue(notifySQL, qn)
	br, err := d.batch(ctx, b)
	if err != nil {
		return 0, err
	}
	defer br.Close()
	tag, err := br.Exec()
	if err != nil {
		return 0, fmt.Errorf("postgres: enqueue on %q: %w", qn, err)
	}
	revived := tag.RowsAffected() == 1
	var inserted bool
	err = br.QueryRow().Scan(&inserted)
	res := qdriver.Added
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res = qdriver.Kept
	case err != nil:
		return 0, fmt.Errorf("postgres: enqueue on %q: %w", qn, err)
	case inserted || revived:
	case r.Mode == qdriver.Replace:
		res = qdriver.Replaced
	default:
		res = qdriver.Rescheduled
	}
	if _, err := br.Exec(); err != nil {
		return 0, fmt.Errorf("postgres: enqueue on %q: %w", qn, err)
	}
	return res, br.Close()
}

// recoverSQL makes the expired claims due again at their deadline, or dead
// when $2 > 0 and they have had $2 deliveries.
const recoverSQL = `UPDATE dlock_tasks SET token = NULL,
	state = CASE WHEN $2::int > 0 AND attempts >= $2::int THEN 2 ELSE 0 END,
	due = CASE WHEN $2::int > 0 AND attempts >= $2::int THEN date_trunc('milliseconds', now()) ELSE due END
	WHERE queue = $1 AND state = 1 AND due <= now()`

// waitSQL is the time in ms until the next due task or claim expiry.
const waitSQL = `SELECT (extract(epoch from (LEAST(
	(SELECT min(due) FROM dlock_tasks WHERE queue = $1 AND state = 0),
	(SELECT min(due) FROM dlock_tasks WHERE queue = $1 AND state = 1)) - now())) * 1000)::bigint`

type row struct {
	id       string
	due      int64
	attempts int
	payload  []byte
	token    *string
}

func readRows(rows pgx.Rows) ([]row, error) {
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.due, &r.attempts, &r.payload, &r.token); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, r)
	}
	rows.Close()
	slices.SortFunc(out, func(a, b row) int {
		if a.due != b.due {
			return int(a.due - b.due)
		}
		return strings.Compare(a.id, b.id)
	})
	return out, rows.Err()
}

func (r row) task() qdriver.Task {
	return qdriver.Task{ID: r.id, Due: time.UnixMilli(r.due), Payload: r.payload, Attempts: r.attempts}
}

// take runs recover, the operation's statement and the wait query as one
// batch.
func (d *taskDriver) take(ctx context.Context, qn, what string, max int, stmt string, args ...any) ([]row, time.Duration, error) {
	b := &pgx.Batch{}
	b.Queue(d.q(recoverSQL), qn, max)
	b.Queue(d.q(stmt), args...)
	b.Queue(d.q(waitSQL), qn)
	br, err := d.batch(ctx, b)
	if err != nil {
		return nil, 0, err
	}
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	out, err := readRows(rows)
	if err != nil {
		return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	var wait *int64
	if err := br.QueryRow().Scan(&wait); err != nil {
		return nil, 0, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	w := time.Duration(-1)
	if wait != nil {
		w = time.Duration(max64(*wait, 0)) * time.Millisecond
	}
	return out, w, br.Close()
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

var dueMs = fmt.Sprintf(msOf, "due")

func (d *taskDriver) Peek(ctx context.Context, qn string, n int) ([]qdriver.Task, error) {
	rows, _, err := d.take(ctx, qn, "peek", 0, `SELECT id, `+dueMs+`, attempts, payload, token FROM dlock_tasks
		WHERE queue = $1 AND state = 0 AND due <= now() ORDER BY due, id LIMIT $2`, qn, n)
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
	rows, w, err := d.take(ctx, qn, "pop", 0, `DELETE FROM dlock_tasks t USING (
		  SELECT id FROM dlock_tasks WHERE queue = $1 AND state = 0 AND due <= now()
		  ORDER BY due, id LIMIT $2 FOR UPDATE SKIP LOCKED) c
		WHERE t.queue = $1 AND t.id = c.id
		RETURNING t.id, `+fmt.Sprintf(msOf, "t.due")+`, t.attempts, t.payload, t.token`, qn, n)
	return tasksOf(rows), w, err
}

func (d *taskDriver) Claim(ctx context.Context, qn string, n int, vis time.Duration, max int) ([]qdriver.Claimed, time.Duration, error) {
	rows, w, err := d.take(ctx, qn, "claim", max, `UPDATE dlock_tasks t SET state = 1, attempts = t.attempts + 1,
		  token = $3 || ':' || t.id, due = `+dueExpr+` + $4::bigint * interval '1 millisecond'
		FROM (SELECT id, due FROM dlock_tasks WHERE queue = $1 AND state = 0 AND due <= now()
		      ORDER BY due, id LIMIT $2 FOR UPDATE SKIP LOCKED) c
		WHERE t.queue = $1 AND t.id = c.id
		RETURNING t.id, `+fmt.Sprintf(msOf, "c.due")+`, t.attempts, t.payload, t.token`, qn, n, qdriver.NewToken(), vis.Milliseconds())
	out := make([]qdriver.Claimed, len(rows))
	for i, r := range rows {
		out[i] = qdriver.Claimed{Task: r.task(), Token: *r.token}
	}
	return out, w, err
}

// current is the condition of a current claim: $1 queue, $2 id, $3 token.
const current = `queue = $1 AND id = $2 AND state = 1 AND token = $3 AND due > now()`

func (d *taskDriver) exec(ctx context.Context, what, qn string, notify bool, stmt string, args ...any) (bool, error) {
	b := &pgx.Batch{}
	b.Queue(d.q(stmt), args...)
	if notify {
		b.Queue(notifySQL, qn)
	}
	br, err := d.batch(ctx, b)
	if err != nil {
		return false, err
	}
	defer br.Close()
	tag, err := br.Exec()
	if err == nil && notify {
		_, err = br.Exec()
	}
	if err != nil {
		return false, fmt.Errorf("postgres: %s on %q: %w", what, qn, err)
	}
	return tag.RowsAffected() == 1, br.Close()
}

func (d *taskDriver) Ack(ctx context.Context, qn, id, token string) (bool, error) {
	return d.exec(ctx, "ack", qn, false, `DELETE FROM dlock_tasks WHERE `+current, qn, id, token)
}

func (d *taskDriver) Extend(ctx context.Context, qn, id, token string, ext time.Duration) (bool, error) {
	return d.exec(ctx, "extend", qn, false, `UPDATE dlock_tasks SET due = `+dueExpr+` + $4::bigint * interval '1 millisecond' WHERE `+current,
		qn, id, token, ext.Milliseconds())
}

func (d *taskDriver) Nack(ctx context.Context, qn, id, token string, delay time.Duration, max int) (bool, error) {
	return d.exec(ctx, "nack", qn, true, `UPDATE dlock_tasks SET token = NULL,
		state = CASE WHEN $5::int > 0 AND attempts >= $5::int THEN 2 ELSE 0 END,
		due = `+dueExpr+` + CASE WHEN $5::int > 0 AND attempts >= $5::int THEN interval '0' ELSE $4::bigint * interval '1 millisecond' END
		WHERE `+current, qn, id, token, delay.Milliseconds(), max)
}

func (d *taskDriver) Delete(ctx context.Context, qn, id string, due time.Time) (bool, error) {
	return d.exec(ctx, "delete", qn, false, `DELETE FROM dlock_tasks WHERE queue = $1 AND id = $2 AND state = 0
		AND due = 'epoch'::timestamptz + $3::bigint * interval '1 millisecond'`, qn, id, due.UnixMilli())
}

func (d *taskDriver) Requeue(ctx context.Context, qn, id string, delay time.Duration) (bool, error) {
	return d.exec(ctx, "requeue", qn, true, `UPDATE dlock_tasks SET state = 0, attempts = 0, token = NULL,
		due = `+dueExpr+` + $3::bigint * interval '1 millisecond' WHERE queue = $1 AND id = $2 AND state = 2`, qn, id, delay.Milliseconds())
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
	rows, err := d.pool.Query(ctx, d.q(`SELECT id, `+dueMs+`, attempts, payload, token FROM dlock_tasks
		WHERE queue = $1 AND state = 2 ORDER BY due, id LIMIT $2`), qn, n)
	if err != nil {
		return nil, fmt.Errorf("postgres: dead letters of %q: %w", qn, err)
	}
	out, err := readRows(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: dead letters of %q: %w", qn, err)
	}
	return tasksOf(out), nil
}

// Watch registers a waiter for the queue's wake-ups: the Client's listening
// connection (one, taken from the pool while anyone waits) LISTENs on the
// channel, and a notification with the queue's name signals every waiter
// of that queue. A listening connection that fails wakes every waiter (a
// notification may have been missed) and is replaced at the next Watch.
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
			for _, ws := range d.watchers {
				for c := range ws {
					signal(c)
				}
			}
			d.wmu.Unlock()
			if ctx.Err() != nil {
				// Stopped: UNLISTEN before the connection goes back.
				uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, uerr := conn.Exec(uctx, "UNLISTEN *")
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
		for c := range d.watchers[n.Payload] {
			signal(c)
		}
		d.wmu.Unlock()
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
