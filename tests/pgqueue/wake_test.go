package pgqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/tests/internal/testutil"

	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/pgqueue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var tableSeq atomic.Int64

// wakeTable returns a task table of its own for the test (dropped at
// cleanup), so that no other test's listener holds its waiters key, and a
// pool on addr.
func wakeTable(t *testing.T, addr string) (string, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(t.Context(), poolConfig(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := fmt.Sprintf("dlock_tasks_wake_%d_%d", time.Now().UnixNano(), tableSeq.Add(1))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return table, pool
}

func newTaskQueue(t *testing.T, pool *pgxpool.Pool, table, name string) *queue.Queue {
	t.Helper()
	return newTaskQueueOpts(t, pool, table, name, nil)
}

// newTaskQueueOpts is newTaskQueue with the queue's options.
func newTaskQueueOpts(t *testing.T, pool *pgxpool.Pool, table, name string, opts *queue.Options) *queue.Queue {
	t.Helper()
	c, err := pgqueue.NewQueue(pool, &pgqueue.QueueOptions{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	q, err := c.Queue(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// firstNotification returns the payload of the next notification on c.
func firstNotification(t *testing.T, c *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	n, err := c.WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n.Payload
}

// An Enqueue sends a NOTIFY only while some session holds the table's
// waiters key, as doc.go's Layout says (from psql): a LISTEN alone hears
// nothing, a LISTEN with the key hears the enqueue. Notifications arrive
// in commit order, so a marker sent after the Enqueue tells whether it
// notified.
func TestEnqueueNotifiesOnlyRegisteredListeners(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	q := newTaskQueue(t, pool, table, uniqueName(t))
	listener, marker := rawConn(t, srv.Addr()), rawConn(t, srv.Addr())
	if _, err := listener.Exec(ctx, "LISTEN dlock_tasks"); err != nil {
		t.Fatal(err)
	}
	step := func(id string) string {
		t.Helper()
		if _, err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := marker.Exec(ctx, "SELECT pg_notify('dlock_tasks', 'marker')"); err != nil {
			t.Fatal(err)
		}
		got := firstNotification(t, listener)
		if got != "marker" {
			if m := firstNotification(t, listener); m != "marker" {
				t.Fatalf("after %q's notification: got %q, want the marker", got, m)
			}
		}
		return got
	}
	if got := step("a"); got != "marker" {
		t.Errorf("with no registered listener: got a notification %q before the marker, want none", got)
	}
	if _, err := listener.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_lock_shared(hashtextextended('%s', 5))", table)); err != nil {
		t.Fatal(err)
	}
	if got := step("b"); got != q.Name() {
		t.Errorf("with a registered listener: got %q first, want the queue's name %q", got, q.Name())
	}
}

// The barrier: an Enqueue that tested the waiters key before a listener
// took it (so it will not notify) and has not committed when the listener
// registers holds the listener's Client back until it commits, so that the
// Client's first look sees the task. The Enqueue is held uncommitted by a
// raw transaction inserting the same id; the ClaimWait must have the task
// promptly once that transaction rolls back (without the barrier it would
// sleep until queue's longest wait, 5s, past its 3s ctx).
func TestWakeupBarrier(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	name := uniqueName(t)
	producer := newTaskQueue(t, pool, table, name)
	if _, err := producer.Len(ctx); err != nil { // creates the table
		t.Fatal(err)
	}
	raw, watch := rawConn(t, srv.Addr()), rawConn(t, srv.Addr())
	tx, err := raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var xid int64
	if err := tx.QueryRow(ctx, "INSERT INTO "+table+" (queue, id, due, payload) VALUES ($1, 'x', now(), '') RETURNING pg_current_xact_id()::text::bigint", name).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	enq := make(chan error, 1)
	go func() {
		_, err := producer.Enqueue(ctx, "x", nil)
		enq <- err
	}()
	awaitRow(t, watch, "the Enqueue waiting for the raw transaction",
		"SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND transactionid::text::bigint = $1 AND NOT granted", xid)
	worker := newTaskQueue(t, pool, table, name)
	type result struct {
		cl  []*queue.Claim
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		cl, err := worker.ClaimWait(wctx, 1, time.Minute)
		got <- result{cl, err, time.Now()}
	}()
	awaitRow(t, watch, "the listener waiting at the barrier", fmt.Sprintf(`SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted AND mode = 'ExclusiveLock'
		  AND classid = ((hashtextextended('%[1]s', 6) >> 32) & 4294967295)::oid
		  AND objid = (hashtextextended('%[1]s', 6) & 4294967295)::oid`, table))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-enq; err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	r := <-got
	if r.err != nil || len(r.cl) != 1 || r.cl[0].ID != "x" {
		t.Fatalf("ClaimWait: got %d tasks, %v; want task x (a missed wake-up)", len(r.cl), r.err)
	}
	if d := r.at.Sub(done); d > time.Second {
		t.Errorf("ClaimWait had the task %v after the Enqueue returned, want at once", d)
	}
}

// awaitRow waits until query (one count) on c is positive: a server-side
// event the test synchronises on.
func awaitRow(t *testing.T, c *pgx.Conn, what, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := c.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen in 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Races between an Enqueue and a ClaimWait that starts at the same moment
// on a new Client (whose listener registers during the race), many times
// over, several at once: no ClaimWait sleeps past its task. The bound
// (2s after the Enqueue returned) is far above the wake-up path (ms; a
// wake-up came 1.3s late at load ~12 in busy run 32, when it was 1s) and
// below queue's longest wait (5s), which is how long a ClaimWait that
// missed its wake-up sleeps; the ClaimWait's ctx (4s) ends before that.
// One task in three is delayed (3 to 15ms), so that the ClaimWait also
// wakes on its timer to the due time (and its last sleep in the kernel,
// tasks_due.go): the bound then counts from the due time.
func TestNoMissedWakeups(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	const pairs, rounds = 4, 60
	if _, err := newTaskQueue(t, pool, table, "setup").Len(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		missed, total atomic.Int64
		worst         atomic.Int64
		wg            sync.WaitGroup
	)
	for p := range pairs {
		producer := newTaskQueue(t, pool, table, fmt.Sprintf("%s-%d", uniqueName(t), p))
		wg.Go(func() {
			for i := range rounds {
				c, err := pgqueue.NewQueue(pool, &pgqueue.QueueOptions{Table: table})
				if err != nil {
					t.Error(err)
					return
				}
				worker, _ := c.Queue(producer.Name(), nil)
				start := make(chan struct{})
				type result struct {
					cl  []*queue.Claim
					err error
					at  time.Time
				}
				got := make(chan result, 1)
				go func() {
					wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
					defer cancel()
					<-start
					cl, err := worker.ClaimWait(wctx, 1, time.Minute)
					got <- result{cl, err, time.Now()}
				}()
				close(start)
				if i%3 == 1 {
					time.Sleep(time.Duration(i%7) * 100 * time.Microsecond) // vary who goes first
				}
				var delay time.Duration
				if i%3 == 2 {
					delay = time.Duration(i%5+1) * 3 * time.Millisecond
				}
				sent := time.Now()
				if _, err := producer.Enqueue(ctx, fmt.Sprint("t", i), &queue.EnqueueOptions{Delay: delay}); err != nil {
					t.Error(err)
				}
				enqueued := time.Now()
				if due := sent.Add(delay); due.After(enqueued) {
					enqueued = due
				}
				r := <-got
				total.Add(1)
				late := r.at.Sub(enqueued)
				for w := worst.Load(); int64(late) > w && !worst.CompareAndSwap(w, int64(late)); w = worst.Load() {
				}
				switch {
				case errors.Is(r.err, context.DeadlineExceeded) || r.err == nil && late > 2*time.Second:
					missed.Add(1)
				case r.err != nil:
					t.Error(r.err)
				case len(r.cl) != 1:
					t.Errorf("ClaimWait returned %d tasks, want 1", len(r.cl))
				default:
					if err := r.cl[0].Ack(ctx); err != nil {
						t.Error(err)
					}
				}
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	t.Logf("%d races, %d wake-ups missed, slowest ClaimWait %v after its Enqueue returned (or its task was due)", total.Load(), missed.Load(), time.Duration(worst.Load()))
	if missed.Load() > 0 {
		t.Errorf("%d of %d ClaimWaits slept past their task, want none", missed.Load(), total.Load())
	}
}

// A Nack and a Requeue, which make a task due again, wake a ClaimWait
// blocked in another Client (registered as a listener), well before
// queue's longest wait (5s): they notify as Enqueue does.
func TestNackAndRequeueWake(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	name := uniqueName(t)
	a := newTaskQueue(t, pool, table, name)
	watch := rawConn(t, srv.Addr())
	c, err := pgqueue.NewQueue(pool, &pgqueue.QueueOptions{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	dead, err := c.Queue(name, &queue.Options{MaxAttempts: 1}) // a Nack dead-letters
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"Nack", "Requeue"} {
		if _, err := a.Enqueue(ctx, kind, nil); err != nil {
			t.Fatal(err)
		}
		claimer := a
		if kind == "Requeue" {
			claimer = dead
		}
		cl, err := claimer.Claim(ctx, 1, time.Minute)
		if err != nil || len(cl) != 1 {
			t.Fatalf("Claim: %d, %v", len(cl), err)
		}
		if kind == "Requeue" {
			if err := cl[0].Nack(ctx, 0); err != nil { // its one attempt: dead
				t.Fatal(err)
			}
		}
		b := newTaskQueue(t, pool, table, name)
		got := make(chan error, 1)
		go func() {
			cs, err := b.ClaimWait(ctx, 1, time.Minute)
			if err == nil && len(cs) == 1 {
				err = cs[0].Ack(ctx)
			}
			got <- err
		}()
		awaitRow(t, watch, "the waiter's listener", fmt.Sprintf(`SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND mode = 'ShareLock'
			  AND classid = ((hashtextextended('%[1]s', 5) >> 32) & 4294967295)::oid
			  AND objid = (hashtextextended('%[1]s', 5) & 4294967295)::oid`, table))
		time.Sleep(200 * time.Millisecond) // let it block (no event tells that it has)
		sent := time.Now()
		if kind == "Nack" {
			err = cl[0].Nack(ctx, 0)
		} else {
			var ok bool
			if ok, err = a.Requeue(ctx, kind, 0); err == nil && !ok {
				err = fmt.Errorf("Requeue: the task was not dead")
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			if d := time.Since(sent); d > time.Second {
				t.Errorf("ClaimWait returned %v after the %s: not woken by it", d, kind)
			}
		case <-time.After(4 * time.Second):
			t.Fatalf("ClaimWait not woken by the %s", kind)
		}
	}
}

// A listener stopped after its last waiter left (and the linger passed)
// drops the waiters key with its UNLISTEN and goes back to the pool, its
// session alive: enqueues stop notifying, and no connection is lost.
func TestListenerDropsWaitersKey(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	q := newTaskQueue(t, pool, table, uniqueName(t))
	watch := rawConn(t, srv.Addr())
	held := fmt.Sprintf(`SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		  AND classid = ((hashtextextended('%[1]s', 5) >> 32) & 4294967295)::oid
		  AND objid = (hashtextextended('%[1]s', 5) & 4294967295)::oid`, table)
	// The listener once registered: the key held shared by a session that
	// is idle, its registration (the key, then a barrier that waits for
	// changes in flight) over. Busy run 28 took the key alone for it; the
	// ClaimWait, cancelled while the barrier still waited, then rightly
	// closed the half-registered connection.
	registered := held + ` AND mode = 'ShareLock'
		  AND pid IN (SELECT pid FROM pg_stat_activity WHERE state = 'idle')`
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := q.ClaimWait(wctx, 1, time.Minute)
		done <- err
	}()
	awaitRow(t, watch, "the listener holding the waiters key", registered)
	var pid int32
	if err := watch.QueryRow(ctx, strings.Replace(registered, "count(*)", "pid", 1)).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("ClaimWait: got %v, want context.Canceled", err)
	}
	awaitRow(t, watch, "the waiters key dropped", "SELECT count(*) FROM ("+held+") n WHERE count = 0")
	var alive bool
	if err := watch.QueryRow(ctx, "SELECT count(*) = 1 FROM pg_stat_activity WHERE pid = $1", pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if !alive {
		t.Errorf("the listening connection (pid %d) was closed, want it back in the pool", pid)
	}
}
