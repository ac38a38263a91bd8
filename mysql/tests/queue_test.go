package tests_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/mysql/mysqlqueue"
	"github.com/dlock/dlock/queue"
	qconf "github.com/dlock/dlock/queue/conformance"
)

// queueHarness gives every Client a pool of its own, opened from a URL,
// dialling the server through its own faultnet proxy.
type queueHarness struct {
	addr string
	raw  *sql.DB
}

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	t.Helper()
	p := faultnet.ListenT(t, h.addr)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := queue.Open(ctx, url(p.Addr(), ""))
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func (h queueHarness) Residue(ctx context.Context, name string) ([]string, error) {
	rows, err := h.raw.QueryContext(ctx, "SELECT id, state FROM dlock_tasks WHERE queue = ?", name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var (
			id    string
			state int
		)
		if err := rows.Scan(&id, &state); err != nil {
			return nil, err
		}
		left = append(left, fmt.Sprintf("dlock_tasks row %s (state %d)", id, state))
	}
	return left, rows.Err()
}

// The task queue on MariaDB passes the queue suite, faults included
// (black-holed and reset connections).
func TestQueueConformance(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.MariaDB)
	qconf.Run(t, queueHarness{addr: srv.Addr(), raw: rawDB(t, srv.Addr())})
}

// newQueue returns a queue on a Client made with NewQueue on a pool
// without interpolateParams (each statement prepared), as an application
// may have it, closed when the test ends.
func newQueue(t *testing.T, addr string, name string) *queue.Queue {
	t.Helper()
	c, err := mysqlqueue.NewQueue(rawDB(t, addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	q, err := c.Queue(name+"/"+time.Now().Format("150405.000000"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// On the application's pool (server-side prepared statements): results of
// Enqueue, an Extend that sets the deadline it already has (no row
// changed) still succeeds, and a dead task enqueued again is added anew.
func TestQueueOnApplicationPool(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.MariaDB)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q := newQueue(t, srv.Addr(), "pool")
	for _, tc := range []struct {
		opts *queue.EnqueueOptions
		want queue.EnqueueResult
	}{
		{&queue.EnqueueOptions{Payload: []byte("a")}, queue.Added},
		{&queue.EnqueueOptions{Payload: []byte("b")}, queue.Kept},
		{&queue.EnqueueOptions{Payload: []byte("c"), Replace: true}, queue.Replaced},
		{&queue.EnqueueOptions{Reschedule: true}, queue.Rescheduled},
	} {
		if got, err := q.Enqueue(ctx, "t", tc.opts); err != nil || got != tc.want {
			t.Fatalf("Enqueue(%+v): %v, %v; want %v", tc.opts, got, err, tc.want)
		}
	}
	cs, err := q.Claim(ctx, 1, time.Hour)
	if err != nil || len(cs) != 1 || string(cs[0].Payload) != "c" || cs[0].Attempts != 1 {
		t.Fatalf("Claim: %v, %v; want t with payload c, attempt 1", cs, err)
	}
	// Extend by the visibility the claim has, at once: most often in the
	// same ms, so the deadline is set to the value it has.
	for range 20 {
		if err := cs[0].Extend(ctx, time.Hour); err != nil {
			t.Fatalf("Extend: %v", err)
		}
	}
	if err := cs[0].Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	st, err := q.Stats(ctx)
	if err != nil || st != (queue.Stats{Due: 1}) {
		t.Fatalf("Stats after Nack: %+v, %v; want one due", st, err)
	}
	// Dead-letter a task (DefaultMaxAttempts Nacks), then enqueue it
	// again: added anew, attempts reset.
	one := newQueue(t, srv.Addr(), "pool-dead")
	if _, err := one.Enqueue(ctx, "d", &queue.EnqueueOptions{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	cl, err := one.Claim(ctx, 1, time.Hour)
	if err != nil || len(cl) != 1 {
		t.Fatalf("Claim: %v, %v", cl, err)
	}
	if err := cl[0].Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if cl, err = one.Claim(ctx, 1, time.Hour); err != nil || len(cl) != 1 {
			t.Fatalf("Claim: %v, %v", cl, err)
		}
		if err := cl[0].Nack(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := one.Stats(ctx); err != nil || st != (queue.Stats{Dead: 1}) {
		t.Fatalf("Stats after %d Nacks: %+v, %v; want one dead", queue.DefaultMaxAttempts, st, err)
	}
	if got, err := one.Enqueue(ctx, "d", &queue.EnqueueOptions{Payload: []byte("y")}); err != nil || got != queue.Added {
		t.Fatalf("Enqueue of a dead id: %v, %v; want added", got, err)
	}
	if cl, err = one.Claim(ctx, 1, time.Hour); err != nil || len(cl) != 1 || cl[0].Attempts != 1 || string(cl[0].Payload) != "y" {
		t.Fatalf("Claim after the dead id was enqueued again: %v, %v; want attempt 1, payload y", cl, err)
	}
}

// Bad URLs fail with ErrInvalid before any I/O (the hosts do not exist),
// and no error shows the password.
func TestQueueBadURLs(t *testing.T) {
	const secret = "s3cretpw"
	for _, u := range []string{
		"mysql://u:" + secret + "@h/db?bogus=1",
		"mysql://u:" + secret + "@h/db?queue_table=a;b",
		"mysql://u:" + secret + "@h/db?queue_table=a.b.c",
		"mysql://u:" + secret + "@h/db?poll_interval=0s",
		"mysql://u:" + secret + "@h/db?poll_interval=x",
		"mysql://u:" + secret + "@h/db?max_idle_conns=-1",
		"mysql://u:" + secret + "@h/db?queue_table=a&queue_table=b",
		"mysql://u:" + secret + "@h",
		"mysql://u:" + secret + "@h/db/more",
		"mysql://u:" + secret + "@h:99999/db",
		"mysql://u:" + secret + "@/db",
		"mysql://u:" + secret + "@h/db?ttl=abc",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		c, err := queue.Open(ctx, u)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%s): no error", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s): %v, want ErrInvalid", u, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Open(%s) took %v: not rejected before I/O", u, d)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): the error shows the password: %v", u, err)
		}
	}
	// A schema-qualified table needs no database in the URL; the host does
	// not exist, so Open fails connecting, not on the URL.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := queue.Open(ctx, "mysql://u:"+secret+"@nonexistent.invalid?queue_table=jobs.tasks&connect_timeout=1s")
	if err == nil || errors.Is(err, dlock.ErrInvalid) || strings.Contains(err.Error(), secret) {
		t.Errorf("Open with queue_table=jobs.tasks and no database: %v, want a connection error without the password", err)
	}
	if _, err := mysqlqueue.NewQueue(nil, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("NewQueue(nil): %v, want ErrInvalid", err)
	}
}
