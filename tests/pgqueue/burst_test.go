package pgqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/tests/internal/testutil"
	"github.com/jackc/pgx/v5/pgxpool"
)

// nestedLoopPool is a pool on a fresh table (no ANALYZE: the statistics
// of an empty table) whose sessions plan every join as a nested loop
// without a Material node, the plan PostgreSQL chose with stale
// statistics for a pick joined to the table.
func nestedLoopPool(t *testing.T, addr string) (string, *pgxpool.Pool) {
	t.Helper()
	cfg := poolConfig(t, addr)
	for k, v := range map[string]string{"enable_hashjoin": "off", "enable_mergejoin": "off", "enable_material": "off"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := fmt.Sprintf("dlock_tasks_burst_%d_%d", time.Now().UnixNano(), tableSeq.Add(1))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return table, pool
}

// A burst of tasks on a fresh table, taken by 8 workers: no ClaimWait or
// PopWait returns more than the n it asked for, every task is taken once.
// The pick once joined to the table was run again per queued row under
// such a plan: ClaimWait(10) returned up to 276 tasks.
func TestBurstTakesAtMostN(t *testing.T) {
	const tasks, workers, n = 400, 8, 10
	srv := dlocktest.Require(t, dlocktest.Postgres)
	for _, op := range []string{"claim", "pop"} {
		t.Run(op, func(t *testing.T) {
			ctx := testutil.Ctx(t)
			table, pool := nestedLoopPool(t, srv.Addr())
			name := uniqueName(t)
			q := newTaskQueue(t, pool, table, name)
			if _, err := q.Peek(ctx, 1); err != nil { // creates the table
				t.Fatal(err)
			}
			bound, err := conformance.Live(60 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			var (
				mu     sync.Mutex
				seen   = map[string]int{}
				over   []int
				wg     sync.WaitGroup
				errs   = make(chan error, workers+1)
				queues = make([]*queue.Queue, workers)
			)
			for w := range queues {
				queues[w] = newTaskQueue(t, pool, table, name)
			}
			for w, qw := range queues {
				wg.Go(func() {
					for {
						var ids []string
						switch op {
						case "claim":
							cs, err := qw.ClaimWait(wctx, n, time.Minute)
							if err != nil {
								if wctx.Err() == nil {
									errs <- fmt.Errorf("worker %d: ClaimWait: %w", w, err)
								}
								return
							}
							for _, c := range cs {
								ids = append(ids, c.ID)
							}
						case "pop":
							ts, err := qw.PopWait(wctx, n)
							if err != nil {
								if wctx.Err() == nil {
									errs <- fmt.Errorf("worker %d: PopWait: %w", w, err)
								}
								return
							}
							for _, t := range ts {
								ids = append(ids, t.ID)
							}
						}
						mu.Lock()
						if len(ids) > n {
							over = append(over, len(ids))
						}
						for _, id := range ids {
							seen[id]++
						}
						done := len(seen) == tasks
						mu.Unlock()
						if done {
							cancel()
							return
						}
					}
				})
			}
			var ewg sync.WaitGroup
			for p := range 4 {
				ewg.Go(func() {
					for i := p; i < tasks; i += 4 {
						if _, err := q.Enqueue(ctx, fmt.Sprintf("t%04d", i), nil); err != nil {
							errs <- fmt.Errorf("Enqueue: %w", err)
							return
						}
					}
				})
			}
			ewg.Wait()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if len(over) > 0 {
				t.Errorf("%d of the %s calls returned more than n = %d tasks: %v", len(over), op, n, over)
			}
			twice := 0
			for _, k := range seen {
				if k > 1 {
					twice++
				}
			}
			if twice > 0 {
				t.Errorf("%d tasks taken more than once", twice)
			}
			if len(seen) != tasks {
				t.Errorf("%d of %d tasks taken within %v", len(seen), tasks, bound)
			}
		})
	}
}
