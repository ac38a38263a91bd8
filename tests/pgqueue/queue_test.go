package pgqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	qconf "github.com/dlock/dlock/queue/conformance"
	"github.com/dlock/dlock/queue/pgqueue"
	"github.com/jackc/pgx/v5/pgxpool"
)

type queueHarness struct {
	addr string
	raw  *pgxpool.Pool
}

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	t.Helper()
	p := faultnet.ListenT(t, h.addr)
	cfg, err := pgxpool.ParseConfig(dsn(p.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := pgqueue.NewQueue(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func (h queueHarness) Residue(ctx context.Context, name string) ([]string, error) {
	rows, err := h.raw.Query(ctx, "SELECT id FROM dlock_tasks WHERE queue = $1", name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		left = append(left, "dlock_tasks row "+id)
	}
	return left, rows.Err()
}

// The task queue on PostgreSQL passes the suite.
func TestQueueConformance(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.Postgres)
	raw, err := pgxpool.New(t.Context(), dsn(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	qconf.Run(t, queueHarness{addr: srv.Addr(), raw: raw})
}

// A new Client starts beside a transaction writing to the table: learning
// that the table exists takes no lock on it. (Running CREATE INDEX IF NOT
// EXISTS each time did: a SHARE lock that waited for every writer and held
// every later one up behind it.)
func TestQueueStartsBesideWriters(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q := newTaskQueue(t, pool, table, "busy")
	if _, err := q.Enqueue(ctx, "a", nil); err != nil { // creates the table
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (queue, id, due, payload) VALUES ('other', 'x', now(), '')"); err != nil {
		t.Fatal(err)
	}
	bound, err := conformance.Live(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	q2 := newTaskQueue(t, pool, table, "busy")
	ctx2, cancel2 := context.WithTimeout(ctx, bound)
	defer cancel2()
	if _, err := q2.Enqueue(ctx2, "b", nil); err != nil {
		t.Fatalf("a new Client's Enqueue while another transaction writes to the table: %v", err)
	}
}
