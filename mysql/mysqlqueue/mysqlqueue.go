package mysqlqueue

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/mysql"
	"github.com/dlock/dlock/mysql/internal/ident"
	"github.com/dlock/dlock/queue"
	qdriver "github.com/dlock/dlock/queue/driver"
	gomysql "github.com/go-sql-driver/mysql"
)

func init() {
	qdriver.Register("mysql", openURL)
}

//go:embed tasks.sql
var tasksDDL string

const (
	// DefaultTable is the task table's name (Options.Table).
	DefaultTable = "dlock_tasks"
	// DefaultPollInterval is how often a Client with a waiting ClaimWait
	// or PopWait asks the server whether a task became due sooner than it
	// was told (Options.PollInterval).
	DefaultPollInterval = 50 * time.Millisecond
)

// Parameters this package takes out of a URL before the lock driver's
// ParseURL reads the rest.
const (
	paramTable        = "queue_table"
	paramPollInterval = "poll_interval"
	paramMaxOpenConns = "max_open_conns"
	paramMaxIdleConns = "max_idle_conns"
)

// Options configure a task-queue Client. A nil *Options means all defaults.
type Options struct {
	// Table is the task table's name, or schema.name (URL: queue_table),
	// created on first use when missing. Default DefaultTable, in the
	// connection's database.
	Table string
	// PollInterval is how often a Client with a ClaimWait or PopWait
	// waiting asks the server for the queue's next due time (URL:
	// poll_interval): MySQL has no notifications, so an Enqueue, Nack or
	// Requeue by another Client reaches a waiter within about this long.
	// Those of the same Client wake it at once. Default
	// DefaultPollInterval.
	PollInterval time.Duration
}

func (o *Options) check() error {
	if o == nil {
		return nil
	}
	if o.Table != "" {
		if err := ident.CheckTable("queue table", o.Table); err != nil {
			return invalid("%v", err)
		}
	}
	if o.PollInterval < 0 {
		return invalid("negative poll interval %v", o.PollInterval)
	}
	return nil
}

// NewQueue returns a task-queue Client (package queue) on the
// application's database handle, which must reach MariaDB 10.6 or MySQL
// 8.0 or later (FOR UPDATE SKIP LOCKED). Claim and Pop are a transaction
// each (READ COMMITTED), every other operation one statement. Closing the
// Client does not close db. A handle whose DSN sets interpolateParams=true
// saves a round trip per statement (Open's pool does).
func NewQueue(db *sql.DB, opts *Options) (*queue.Client, error) {
	if db == nil {
		return nil, invalid("nil *sql.DB")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	return queue.New(newDriver(db, opts, false)), nil
}

// openURL is the queue driver's OpenFunc for mysql:// URLs: the lock
// driver's URL (mysql.ParseURL: TLS, connect_timeout; its lock options are
// accepted and ignored) with queue_table, poll_interval, max_open_conns and
// max_idle_conns. The pool connects lazily; queue.Open calls Ping.
func openURL(_ context.Context, u *url.URL) (qdriver.Driver, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, dlockdriver.QueryError("mysql", err)
	}
	p := dlockdriver.Params{Q: q, Driver: "mysql"}
	var opts Options
	opts.Table, _ = p.Take(paramTable)
	opts.PollInterval, _ = p.TakeDuration(paramPollInterval)
	maxOpen, maxIdle := 0, mysql.DefaultMaxIdleConns
	for _, n := range []struct {
		param string
		into  *int
	}{{paramMaxOpenConns, &maxOpen}, {paramMaxIdleConns, &maxIdle}} {
		if v, ok := p.Take(n.param); ok {
			i, err := strconv.Atoi(v)
			if err != nil || i < 0 {
				return nil, invalid("%s=%q: want a whole number, 0 or more", n.param, v)
			}
			*n.into = i
		}
	}
	if p.Err != nil {
		return nil, p.Err
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	rest := *u
	rest.RawQuery = p.Q.Encode()
	cfg, _, err := mysql.ParseURL(&rest)
	if err != nil {
		return nil, err
	}
	if cfg.DBName == "" && !strings.Contains(opts.Table, ".") {
		return nil, invalid("the URL names no database (mysql://user:pass@host/database) and queue_table no schema")
	}
	// One round trip per statement, not three (prepare, execute, close).
	cfg.InterpolateParams = true
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, invalid("%s", dlockdriver.RedactText(err.Error(), u))
	}
	db := sql.OpenDB(readCommitted{conn})
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxIdle)
	d := newDriver(db, &opts, true)
	d.addr = dlockdriver.RedactURL(u)
	d.txOpts = nil // the sessions' own level is READ COMMITTED
	return d, nil
}

// readCommitted opens connections whose transactions are READ COMMITTED,
// for the pool Open makes: a Claim or Pop then begins with START
// TRANSACTION alone, one round trip of its six instead of two of seven
// (database/sql sends SET TRANSACTION before each transaction given a
// level). The statement works on every MariaDB and MySQL version, where
// the session variable's name does not (tx_isolation,
// transaction_isolation).
type readCommitted struct{ sqldriver.Connector }

func (c readCommitted) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(sqldriver.ExecerContext)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("mysql: the client library's connection runs no statements")
	}
	if _, err := ex.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

func newDriver(db *sql.DB, opts *Options, owns bool) *taskDriver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	d := &taskDriver{db: db, owns: owns, name: o.Table, poll: o.PollInterval,
		txOpts: &sql.TxOptions{Isolation: sql.LevelReadCommitted}}
	d.sql = strings.NewReplacer("$TABLE", ident.Quote(o.Table))
	d.w.d = d
	return d
}

// taskDriver is the queue driver on one *sql.DB.
type taskDriver struct {
	db   *sql.DB
	owns bool
	addr string // the redacted URL, when opened from one
	name string // the table's name as configured
	poll time.Duration
	sql  *strings.Replacer // puts the quoted table name in place of $TABLE
	// txOpts begin a Claim's or Pop's transaction: READ COMMITTED, or nil
	// on Open's pool, whose sessions are (readCommitted).
	txOpts *sql.TxOptions

	ddlMu sync.Mutex
	ddlOK bool

	w watcher // waiting Claims and Pops, and the poller (watch.go)
}

// q returns stmt with the table's name in place.
func (d *taskDriver) q(stmt string) string { return d.sql.Replace(stmt) }

// Ping connects and makes or finds the table, so that a Client opened
// from a URL fails at Open rather than at its first call. ctx bounds it.
func (d *taskDriver) Ping(ctx context.Context) error {
	where := ""
	if d.addr != "" {
		where = " to " + d.addr
	}
	if err := d.db.PingContext(ctx); err != nil {
		return fmt.Errorf("mysql: connecting%s: %w", where, err)
	}
	return d.ensure(ctx)
}

// ensure makes the table when missing, once per driver. It looks first
// with a query that reads no row (a shared metadata lock, which waits for
// no writer), and runs CREATE TABLE IF NOT EXISTS only when the table is
// missing: on a table in use, the DDL's metadata lock may wait behind
// every open transaction on it.
func (d *taskDriver) ensure(ctx context.Context) error {
	d.ddlMu.Lock()
	defer d.ddlMu.Unlock()
	if d.ddlOK {
		return nil
	}
	rows, err := d.db.QueryContext(ctx, d.q("SELECT 1 FROM $TABLE LIMIT 0"))
	if err == nil {
		err = rows.Close()
	}
	if isNumber(err, errNoSuchTable) {
		_, err = d.db.ExecContext(ctx, d.q(tasksDDL))
	}
	if err != nil {
		return fmt.Errorf("mysql: making the task table %s (the user needs CREATE on its database): %w", d.name, err)
	}
	d.ddlOK = true
	return nil
}

// Server error numbers the driver acts on.
const (
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT: the statement is rolled back
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK: the transaction is rolled back
)

func isNumber(err error, n uint16) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

// retryable reports whether err undid the whole statement or transaction,
// so that running it again is as if it ran once.
func retryable(err error) bool {
	return isNumber(err, errDeadlock) || isNumber(err, errLockWaitTimeout)
}

// tries is how often a statement or transaction rolled back by a deadlock
// is run.
const tries = 4

// The server's clock, in SQL. UTC_TIMESTAMP(6) is the statement's start,
// the same at every use in one statement, and TIMESTAMPDIFF from the
// epoch's UTC datetime is the Unix time in µs whatever the session's
// time_zone (UNIX_TIMESTAMP(NOW(6)) is ambiguous in the hour a DST change
// repeats). Due times are ms: a deadline or due time is set from nowCeil
// plus a duration the client rounded up (qdriver.Millis), and "has it
// passed?" is due <= nowFloor, which for a whole ms due is due*1000 <=
// the unrounded now (see package queue/driver's Rounding).
const (
	nowUS    = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
	nowFloor = "(" + nowUS + " DIV 1000)"
	nowCeil  = "((" + nowUS + " + 999) DIV 1000)"
)

// dueAfter is the due time of a task due after the parameter's ms (given
// twice): nowCeil plus them, or, for no delay, nowFloor: due at once.
const dueAfter = "IF(? = 0, " + nowFloor + ", " + nowCeil + " + ?)"

// enqueueSQL inserts the task (queue, id, due at the ms of the epoch given
// or else dueAfter, payload) or, when the id is queued, leaves it (mode 0,
// Keep), replaces it (1) or reschedules it (2), the last two ending any
// claim; a dead task is queued afresh whatever the mode. The mode is given
// four times. LAST_INSERT_ID(state + 10) hands the row's state before the
// statement back in the OK packet (0: no row was there), for the result;
// state is assigned last, so every other assignment reads the old state
// (as it also does under MariaDB's SIMULTANEOUS_ASSIGNMENT).
const enqueueSQL = `INSERT INTO $TABLE (queue, id, state, due, payload, attempts)
VALUES (?, ?, 0, COALESCE(?, ` + dueAfter + `), ?, 0)
ON DUPLICATE KEY UPDATE
  attempts = IF(LAST_INSERT_ID(state + 10) > 0 AND state = 2, 0, attempts),
  payload = IF(state = 2 OR ? = 1, VALUES(payload), payload),
  token = IF(state = 2 OR ? <> 0, NULL, token),
  due = IF(state = 2 OR ? <> 0, VALUES(due), due),
  state = IF(state = 2 OR ? <> 0, 0, state)`

func (d *taskDriver) Enqueue(ctx context.Context, qn string, r qdriver.EnqueueRequest) (qdriver.Result, error) {
	var at any
	if !r.At.IsZero() {
		at = qdriver.UpMilli(r.At).UnixMilli()
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{} // nil is NULL
	}
	delay, mode := qdriver.Millis(r.Delay), int(r.Mode)
	res, err := d.exec(ctx, enqueueSQL, qn, r.ID, at, delay, delay, payload, mode, mode, mode, mode)
	if err != nil {
		return 0, fmt.Errorf("mysql: enqueue on %q: %w", qn, err)
	}
	old, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("mysql: enqueue on %q: %w", qn, err)
	}
	var out qdriver.Result
	switch {
	case old == 0 || old == 12: // inserted, or a dead task queued afresh
		out = qdriver.Added
	case r.Mode == qdriver.Keep:
		return qdriver.Kept, nil
	case r.Mode == qdriver.Replace:
		out = qdriver.Replaced
	default:
		out = qdriver.Rescheduled
	}
	d.w.wakeOne(qn)
	return out, nil
}

// current is the condition of a current claim: queue, id, token given.
const current = `queue = ? AND id = ? AND state = 1 AND token = ? AND due > ` + nowFloor

func (d *taskDriver) Ack(ctx context.Context, qn, id, token string) (bool, error) {
	res, err := d.exec(ctx, `DELETE FROM $TABLE WHERE `+current, qn, id, token)
	return affected(res, err, "ack", qn)
}

// Extend sets the deadline through LAST_INSERT_ID, which the OK packet
// hands back when a row matched: a deadline set again to the value it has
// changes no row, and the rows affected would say "not current".
func (d *taskDriver) Extend(ctx context.Context, qn, id, token string, ext time.Duration) (bool, error) {
	res, err := d.exec(ctx, `UPDATE $TABLE SET due = LAST_INSERT_ID(`+nowCeil+` + ?) WHERE `+current,
		qdriver.Millis(ext), qn, id, token)
	if err != nil {
		return false, fmt.Errorf("mysql: extend on %q: %w", qn, err)
	}
	set, err := res.LastInsertId()
	if err != nil {
		return false, fmt.Errorf("mysql: extend on %q: %w", qn, err)
	}
	return set != 0, nil
}

func (d *taskDriver) Nack(ctx context.Context, qn, id, token string, delay time.Duration, maxAttempts int) (bool, error) {
	ms := qdriver.Millis(delay)
	res, err := d.exec(ctx, `UPDATE $TABLE SET token = NULL,
		due = IF(? > 0 AND attempts >= ?, `+nowFloor+`, `+dueAfter+`),
		state = IF(? > 0 AND attempts >= ?, 2, 0)
		WHERE `+current, maxAttempts, maxAttempts, ms, ms, maxAttempts, maxAttempts, qn, id, token)
	ok, err := affected(res, err, "nack", qn)
	if ok {
		d.w.wakeOne(qn)
	}
	return ok, err
}

func (d *taskDriver) Delete(ctx context.Context, qn, id string, due time.Time) (bool, error) {
	res, err := d.exec(ctx, `DELETE FROM $TABLE WHERE queue = ? AND id = ? AND state = 0 AND due = ?`,
		qn, id, qdriver.UpMilli(due).UnixMilli())
	return affected(res, err, "delete", qn)
}

func (d *taskDriver) Requeue(ctx context.Context, qn, id string, delay time.Duration) (bool, error) {
	ms := qdriver.Millis(delay)
	res, err := d.exec(ctx, `UPDATE $TABLE SET attempts = 0, token = NULL, due = `+dueAfter+`, state = 0
		WHERE queue = ? AND id = ? AND state = 2`, ms, ms, qn, id)
	ok, err := affected(res, err, "requeue", qn)
	if ok {
		d.w.wakeOne(qn)
	}
	return ok, err
}

func (d *taskDriver) Stats(ctx context.Context, qn string) (qdriver.Stats, error) {
	var s qdriver.Stats
	if err := d.ensure(ctx); err != nil {
		return s, err
	}
	err := d.db.QueryRowContext(ctx, d.q(`SELECT
		COALESCE(SUM(state <> 2 AND due <= `+nowFloor+`), 0),
		COALESCE(SUM(state = 0 AND due > `+nowFloor+`), 0),
		COALESCE(SUM(state = 1 AND due > `+nowFloor+`), 0),
		COALESCE(SUM(state = 2), 0)
		FROM $TABLE WHERE queue = ?`), qn).Scan(&s.Due, &s.Delayed, &s.Claimed, &s.Dead)
	if err != nil {
		return s, fmt.Errorf("mysql: stats of %q: %w", qn, err)
	}
	return s, nil
}

func (d *taskDriver) Dead(ctx context.Context, qn string, n int) ([]qdriver.Task, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, d.q(`SELECT id, due, attempts, payload FROM $TABLE
		WHERE queue = ? AND state = 2 ORDER BY due, id LIMIT ?`), qn, n)
	var ts []task
	if err == nil {
		ts, err = scanTasks(rows, true)
	}
	if err != nil {
		return nil, fmt.Errorf("mysql: dead letters of %q: %w", qn, err)
	}
	out := make([]qdriver.Task, len(ts))
	for i, t := range ts {
		out[i] = t.task()
	}
	return out, nil
}

// exec runs stmt (with the table's name put in) after ensure, again when
// a deadlock rolled it back.
func (d *taskDriver) exec(ctx context.Context, stmt string, args ...any) (sql.Result, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	stmt = d.q(stmt)
	for try := 1; ; try++ {
		res, err := d.db.ExecContext(ctx, stmt, args...)
		if err == nil || !retryable(err) || try == tries || ctx.Err() != nil {
			return res, err
		}
	}
}

// affected says whether the statement, which changes at most one row,
// changed one.
func affected(res sql.Result, err error, what, qn string) (bool, error) {
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return false, fmt.Errorf("mysql: %s on %q: %w", what, qn, err)
	}
	return n == 1, nil
}

func (d *taskDriver) Close() error {
	d.w.close()
	if d.owns {
		return d.db.Close()
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: mysql: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
