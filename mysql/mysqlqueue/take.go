package mysqlqueue

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	qdriver "github.com/dlock/dlock/queue/driver"
)

// Taking tasks. MySQL has no UPDATE … RETURNING, so Claim and Pop are a
// transaction each, at READ COMMITTED (locking reads then lock the rows
// they return and no gaps, so Enqueues are never held up behind a Claim):
//
//  1. the queue's next due times (nextSQL), outside the transaction: when
//     nothing is due the call ends there, one statement, with the wait;
//  2. the expired claims (expiredSQL) and the first n due tasks (dueSQL),
//     each FOR UPDATE SKIP LOCKED, so that concurrent Claims take
//     different rows and never wait for each other's;
//  3. in Go, expired claims that have had maxAttempts deliveries are
//     dead-lettered and the others are due at their deadline; the first n
//     of these and the due tasks, in due order, are taken;
//  4. UPDATEs (or, for Pop, a DELETE) of exactly the rows picked, by their
//     ids: the transaction holds their locks, so they wait for nobody;
//  5. COMMIT.
//
// Every statement of steps 2 to 4 reads the server's clock itself; a row
// a later statement changes was picked by an earlier one, so a due time
// seen to have passed has passed for it too.

// expiredLimit bounds the expired claims one Claim or Pop recovers; more
// are recovered by the next.
const expiredLimit = 1000

// nextSQL gives the queue's (given twice) earliest due time of a waiting
// task and earliest claim deadline (NULL for none), and the server's now
// in µs. Each MIN is one dive into the state_due index.
const nextSQL = `SELECT (SELECT MIN(due) FROM $TABLE WHERE queue = ? AND state = 0),
	(SELECT MIN(due) FROM $TABLE WHERE queue = ? AND state = 1), ` + nowUS

// expiredSQL picks the expired claims of the queue.
var expiredSQL = `SELECT id, due, attempts FROM $TABLE FORCE INDEX (state_due)
	WHERE queue = ? AND state = 1 AND due <= ` + nowFloor + `
	ORDER BY due, id LIMIT ` + strconv.Itoa(expiredLimit) + ` FOR UPDATE SKIP LOCKED`

const (
	// dueSQL picks the first n (given) due tasks of the queue.
	dueSQL = `SELECT id, due, attempts, payload FROM $TABLE FORCE INDEX (state_due)
		WHERE queue = ? AND state = 0 AND due <= ` + nowFloor + `
		ORDER BY due, id LIMIT ? FOR UPDATE SKIP LOCKED`
	// peekSQL is both without locking, for Peek: the first n (given
	// twice) of each.
	peekSQL = `(SELECT id, due, attempts, payload FROM $TABLE FORCE INDEX (state_due)
		WHERE queue = ? AND state = 1 AND due <= ` + nowFloor + ` ORDER BY due, id LIMIT ?)
		UNION ALL
		(SELECT id, due, attempts, payload FROM $TABLE FORCE INDEX (state_due)
		WHERE queue = ? AND state = 0 AND due <= ` + nowFloor + ` ORDER BY due, id LIMIT ?)`
)

// task is a row as the statements read it.
type task struct {
	id       string
	due      int64 // ms
	attempts int
	payload  []byte
	expired  bool // an expired claim
}

func (t task) task() qdriver.Task {
	return qdriver.Task{ID: t.id, Due: time.UnixMilli(t.due), Payload: t.payload, Attempts: t.attempts}
}

// dueOrder orders tasks by due time, then id.
func dueOrder(a, b task) int {
	if c := cmp.Compare(a.due, b.due); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// scanTasks reads rows of (id, due, attempts[, payload]) and closes them.
func scanTasks(rows *sql.Rows, payload bool) ([]task, error) {
	defer rows.Close()
	var out []task
	for rows.Next() {
		var t task
		dest := []any{&t.id, &t.due, &t.attempts}
		if payload {
			dest = append(dest, &t.payload)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if payload && t.payload == nil {
			t.payload = []byte{}
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// next is nextSQL's answer.
type next struct {
	waiting, claimed sql.NullInt64 // ms
	nowUS            int64
}

func (n next) due() (waiting, expired bool) {
	return n.waiting.Valid && n.waiting.Int64*1000 <= n.nowUS, n.claimed.Valid && n.claimed.Int64*1000 <= n.nowUS
}

// wait is how long after the statement's now the first task is due or
// claim expires: 0 when one is, -1 when the queue has none.
func (n next) wait() time.Duration {
	first := int64(-1)
	for _, v := range []sql.NullInt64{n.waiting, n.claimed} {
		if v.Valid && (first < 0 || v.Int64 < first) {
			first = v.Int64
		}
	}
	if first < 0 {
		return -1
	}
	return max(time.Duration(first*1000-n.nowUS)*time.Microsecond, 0)
}

func (d *taskDriver) next(ctx context.Context, qn string) (next, error) {
	var n next
	err := d.db.QueryRowContext(ctx, d.q(nextSQL), qn, qn).Scan(&n.waiting, &n.claimed, &n.nowUS)
	return n, err
}

// untilDue turns a wait the server counted from its now into one counted
// from the caller's: the statement's now was taken a moment after sent,
// and the statement the wait's end starts takes as long to reach the
// server, so counted from sent it arrives as the task becomes due. A
// negative wait (nothing queued) stays as it is.
func untilDue(wait time.Duration, sent time.Time) time.Duration {
	if wait < 0 {
		return wait // none queued
	}
	return max(wait-time.Since(sent), 0)
}

// lockedWait is the wait reported when tasks are due but every one was
// locked by another transaction (a Claim about to take it, an Ack about
// to remove it): that transaction ends within milliseconds.
const lockedWait = 2 * time.Millisecond

func (d *taskDriver) Peek(ctx context.Context, qn string, n int) ([]qdriver.Task, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, d.q(peekSQL), qn, n, qn, n)
	var ts []task
	if err == nil {
		ts, err = scanTasks(rows, true)
	}
	if err != nil {
		return nil, fmt.Errorf("mysql: peek on %q: %w", qn, err)
	}
	slices.SortFunc(ts, dueOrder)
	ts = ts[:min(n, len(ts))]
	out := make([]qdriver.Task, len(ts))
	for i, t := range ts {
		out[i] = t.task()
	}
	return out, nil
}

func (d *taskDriver) Pop(ctx context.Context, qn string, n int) ([]qdriver.Task, time.Duration, error) {
	ts, wait, err := d.take(ctx, "pop", qn, n, 0, func(ctx context.Context, tx *sql.Tx, ids []any) error {
		_, err := tx.ExecContext(ctx, d.q(`DELETE FROM $TABLE WHERE queue = ? AND id IN (`+marks(len(ids))+`)`), append([]any{qn}, ids...)...)
		return err
	})
	out := make([]qdriver.Task, len(ts))
	for i, t := range ts {
		out[i] = t.task()
	}
	return out, wait, err
}

func (d *taskDriver) Claim(ctx context.Context, qn string, n int, vis time.Duration, maxAttempts int) ([]qdriver.Claimed, time.Duration, error) {
	token := qdriver.NewToken()
	ts, wait, err := d.take(ctx, "claim", qn, n, maxAttempts, func(ctx context.Context, tx *sql.Tx, ids []any) error {
		_, err := tx.ExecContext(ctx, d.q(`UPDATE $TABLE SET attempts = attempts + 1, token = ?,
			due = `+nowCeil+` + ?, state = 1 WHERE queue = ? AND id IN (`+marks(len(ids))+`)`),
			append([]any{token, qdriver.Millis(vis), qn}, ids...)...)
		return err
	})
	out := make([]qdriver.Claimed, len(ts))
	for i, t := range ts {
		t.attempts++
		out[i] = qdriver.Claimed{Task: t.task(), Token: token}
	}
	return out, wait, err
}

// take runs a Claim or Pop (see the top of this file): take changes the
// rows picked, in the transaction, before it commits. With maxAttempts
// 0 (Pop) expired claims are never dead-lettered. Its statements run under
// statementContext: one cut off by ctx costs its connection (the client
// library closes it), and a transaction's rows stay locked until the
// server sees the close.
func (d *taskDriver) take(ctx context.Context, what, qn string, n, maxAttempts int,
	take func(ctx context.Context, tx *sql.Tx, ids []any) error) ([]task, time.Duration, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("mysql: %s on %q: %w", what, qn, err)
	}
	sctx, stop := statementContext(ctx)
	defer stop()
	for try := 1; ; try++ {
		sent := time.Now()
		nx, err := d.next(sctx, qn)
		if err != nil {
			return nil, 0, fmt.Errorf("mysql: %s on %q: %w", what, qn, err)
		}
		waiting, expired := nx.due()
		if !waiting && !expired {
			return nil, untilDue(nx.wait(), sent), nil
		}
		ts, err := d.takeTx(sctx, qn, n, maxAttempts, waiting, expired, take)
		if err != nil && retryable(err) && try < tries && ctx.Err() == nil {
			continue
		}
		if err != nil {
			// This waiter may have been woken for a task it did not
			// take: another looks.
			d.w.wakeOne(qn)
			return nil, 0, fmt.Errorf("mysql: %s on %q: %w", what, qn, err)
		}
		if len(ts) > 0 {
			return ts, 0, nil
		}
		// Due tasks, every one locked by another transaction, or expired
		// claims dead-lettered: when is the next?
		sent = time.Now()
		if nx, err = d.next(sctx, qn); err != nil {
			return nil, 0, fmt.Errorf("mysql: %s on %q: %w", what, qn, err)
		}
		wait := nx.wait()
		if wait == 0 {
			return nil, lockedWait, nil
		}
		return nil, untilDue(wait, sent), nil
	}
}

// takeTx is one transaction of take: it returns the tasks taken, in due
// order, or an error and nothing taken (unless the COMMIT's answer was
// lost).
func (d *taskDriver) takeTx(sctx context.Context, qn string, n, maxAttempts int, waiting, expired bool,
	take func(ctx context.Context, tx *sql.Tx, ids []any) error) (_ []task, err error) {
	tx, err := d.db.BeginTx(sctx, d.txOpts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var exp, due []task
	if expired {
		rows, err := tx.QueryContext(sctx, d.q(expiredSQL), qn)
		if err == nil {
			exp, err = scanTasks(rows, false)
		}
		if err != nil {
			return nil, err
		}
	}
	if waiting || len(exp) > 0 {
		rows, err := tx.QueryContext(sctx, d.q(dueSQL), qn, n)
		if err == nil {
			due, err = scanTasks(rows, true)
		}
		if err != nil {
			return nil, err
		}
	}
	var dead, back []any // ids: dead-lettered; due again, not taken
	cands := due
	for _, t := range exp {
		if maxAttempts > 0 && t.attempts >= maxAttempts {
			dead = append(dead, t.id)
			continue
		}
		t.expired = true
		cands = append(cands, t)
	}
	slices.SortFunc(cands, dueOrder)
	taken := cands[:min(n, len(cands))]
	var ids, payloads []any // taken; taken expired claims (payload not read yet)
	for _, t := range taken {
		ids = append(ids, t.id)
		if t.expired {
			payloads = append(payloads, t.id)
		}
	}
	for _, t := range cands[len(taken):] {
		if t.expired {
			back = append(back, t.id)
		}
	}
	if len(dead) > 0 {
		if _, err := tx.ExecContext(sctx, d.q(`UPDATE $TABLE SET token = NULL, due = `+nowFloor+`, state = 2
			WHERE queue = ? AND id IN (`+marks(len(dead))+`)`), append([]any{qn}, dead...)...); err != nil {
			return nil, err
		}
	}
	if len(back) > 0 {
		if _, err := tx.ExecContext(sctx, d.q(`UPDATE $TABLE SET token = NULL, state = 0
			WHERE queue = ? AND id IN (`+marks(len(back))+`)`), append([]any{qn}, back...)...); err != nil {
			return nil, err
		}
	}
	if len(payloads) > 0 {
		rows, err := tx.QueryContext(sctx, d.q(`SELECT id, payload FROM $TABLE WHERE queue = ? AND id IN (`+
			marks(len(payloads))+`)`), append([]any{qn}, payloads...)...)
		if err != nil {
			return nil, err
		}
		got := map[string][]byte{}
		for rows.Next() {
			var id string
			var p []byte
			if err := rows.Scan(&id, &p); err != nil {
				rows.Close()
				return nil, err
			}
			got[id] = p
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
		for i, t := range taken {
			if t.expired {
				taken[i].payload = got[t.id]
				if taken[i].payload == nil {
					taken[i].payload = []byte{}
				}
			}
		}
	}
	if len(ids) > 0 {
		if err := take(sctx, tx, ids); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return taken, nil
}

// marks is n placeholders, comma-separated.
func marks(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// statementGrace is how long a transaction already begun may run on after
// its caller's ctx ended.
const statementGrace = time.Second

// statementContext is the context a taking transaction runs under: the
// caller's values, but its end only statementGrace later. The client
// library closes the connection of a statement whose ctx ends, and rows
// a committed transaction claimed or deleted would then reach nobody; a
// transaction takes milliseconds, so the grace is rarely used, and a
// server that does not answer still ends the call statementGrace after
// ctx.
func statementContext(ctx context.Context) (context.Context, func()) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
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
