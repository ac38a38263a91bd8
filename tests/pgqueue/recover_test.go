package pgqueue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/tests/internal/testutil"
)

// Claims running out while tasks keep coming are taken again by the
// workers waiting for them without one Claim waiting for another's row
// locks. Recovering expired claims with a plain UPDATE did: a Claim whose
// snapshot was older than another's waited for the rows that one had
// claimed, while the other waited for the expired claims the first was
// recovering, and PostgreSQL broke the deadlock only after its
// deadlock_timeout (1s), failing one of them ("deadlock detected"): with
// 8 workers, expired claims were taken again at about one a second.
func TestExpiredClaimsRecoveredConcurrently(t *testing.T) {
	const (
		tasks, workers = 400, 8
		vis            = 150 * time.Millisecond
	)
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	table, pool := wakeTable(t, srv.Addr())
	name := uniqueName(t)
	// A late Ack (a loaded machine) makes a third delivery: no
	// dead-lettering here.
	opts := &queue.Options{MaxAttempts: 1 << 20}
	q := newTaskQueueOpts(t, pool, table, name, opts)
	bound, err := conformance.Live(45 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var (
		left    atomic.Int64
		retaken atomic.Int64 // second deliveries
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
	)
	left.Store(tasks)
	for w := range workers {
		qw := newTaskQueueOpts(t, pool, table, name, opts)
		wg.Go(func() {
			for wctx.Err() == nil {
				got, err := qw.ClaimWait(wctx, 4, vis)
				if wctx.Err() != nil {
					return
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d: ClaimWait: %w", w, err)
					cancel()
					return
				}
				for _, c := range got {
					if c.Attempts == 1 {
						continue // let it run out
					}
					retaken.Add(1)
					if err := c.Ack(wctx); err == nil && left.Add(-1) == 0 {
						cancel() // the others are still waiting
					}
				}
			}
		})
	}
	start := time.Now()
	for i := range tasks {
		if _, err := q.Enqueue(wctx, fmt.Sprintf("t%04d", i), &queue.EnqueueOptions{}); err != nil {
			t.Errorf("Enqueue: %v", err)
			break
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d tasks, each claim left to run out and taken again: %d acked in %v (%d second deliveries)",
		tasks, tasks-left.Load(), time.Since(start).Round(time.Millisecond), retaken.Load())
	if n := left.Load(); n > 0 {
		t.Errorf("%d of %d tasks not acked within %v", n, tasks, bound)
	}
}
