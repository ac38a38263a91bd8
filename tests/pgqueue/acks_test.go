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

	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/tests/internal/testutil"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ackCounter is a pgx tracer counting the statements that delete acked
// claims.
type ackCounter struct{ n atomic.Int64 }

func (c *ackCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), "DELETE") && strings.Contains(d.SQL, "token") {
		c.n.Add(1)
	}
	return ctx
}

func (c *ackCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Acks sent together go in shared statements, and each is still checked
// against its own claim: of 300 current claims, 100 stale ones (nacked,
// their tasks claimed again) and 50 current claims acked twice at once,
// every current claim is acked once, every stale or repeated Ack is
// ErrClaimLost, and the queue drains.
func TestAckBatches(t *testing.T) {
	const tasks, nacked, twice = 300, 100, 50
	srv := dlocktest.Require(t, dlocktest.Postgres).Addr()
	ctx := testutil.Ctx(t)
	counter := &ackCounter{}
	cfg := poolConfig(t, srv)
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := fmt.Sprintf("dlock_tasks_acks_%d_%d", time.Now().UnixNano(), tableSeq.Add(1))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	q := newTaskQueue(t, pool, table, uniqueName(t))
	for i := range tasks {
		if _, err := q.Enqueue(ctx, fmt.Sprint("t", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	var claims []*queue.Claim
	for len(claims) < tasks {
		cs, err := q.Claim(ctx, tasks-len(claims), time.Minute)
		if err != nil || len(cs) == 0 {
			t.Fatalf("Claim: %v, %v", cs, err)
		}
		claims = append(claims, cs...)
	}
	var stale []*queue.Claim
	for _, c := range claims[:nacked] {
		if err := c.Nack(ctx, 0); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, c)
	}
	current := claims[nacked:]
	for len(current) < tasks {
		cs, err := q.Claim(ctx, tasks-len(current), time.Minute)
		if err != nil || len(cs) == 0 {
			t.Fatalf("Claim again: %v, %v", cs, err)
		}
		current = append(current, cs...)
	}

	type ack struct {
		c     *queue.Claim
		stale bool
	}
	var all []ack
	for _, c := range current {
		all = append(all, ack{c: c})
	}
	for _, c := range current[:twice] {
		all = append(all, ack{c: c})
	}
	for _, c := range stale {
		all = append(all, ack{c: c, stale: true})
	}
	var (
		mu    sync.Mutex
		acked = map[*queue.Claim]int{}
		bad   []string
		wg    sync.WaitGroup
		start = make(chan struct{})
		next  atomic.Int64
	)
	before := counter.n.Load()
	for range 32 {
		wg.Go(func() {
			<-start
			for {
				i := int(next.Add(1)) - 1
				if i >= len(all) {
					return
				}
				a := all[i]
				err := a.c.Ack(ctx)
				mu.Lock()
				switch {
				case err == nil && !a.stale:
					acked[a.c]++
				case errors.Is(err, queue.ErrClaimLost):
					// Stale, or the second Ack of a claim: every current
					// claim's count is checked below.
				default:
					bad = append(bad, fmt.Sprintf("Ack of %s (stale %v): %v", a.c.ID, a.stale, err))
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	statements := counter.n.Load() - before
	for _, b := range bad {
		t.Error(b)
	}
	for _, c := range current {
		if acked[c] != 1 {
			t.Errorf("current claim on %s acked %d times, want 1", c.ID, acked[c])
		}
	}
	t.Logf("%d Acks in %d statements", len(all), statements)
	if statements >= int64(len(all)) {
		t.Errorf("%d Acks took %d statements: none shared one", len(all), statements)
	}
	if st, err := q.Stats(ctx); err != nil || st != (queue.Stats{}) {
		t.Errorf("Stats after the acks: %+v, %v; want an empty queue", st, err)
	}
}
