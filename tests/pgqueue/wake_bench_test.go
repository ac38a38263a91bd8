package pgqueue_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

// BenchmarkIdleWorkersWake enqueues tasks one at a time, each due at
// once, to 8 workers of one Client waiting in ClaimWait(1): the time
// from the Enqueue's send to a worker having the task (p50, p99), and
// the server's transactions per task (pg_stat_database, every session of
// the database: Enqueue, its NOTIFY, the Claims, the Ack).
func BenchmarkIdleWorkersWake(b *testing.B) {
	const workers = 8
	srv := dlocktest.Require(b, dlocktest.Postgres)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := benchPool(b, srv.Addr())
	table := fmt.Sprintf("dlock_tasks_wakeb_%d", time.Now().UnixNano())
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	name := "bench-wake"
	producer := benchQueue(b, pool, table, name)
	wq := benchQueue(b, pool, table, name) // the workers' Client
	if _, err := producer.Peek(ctx, 1); err != nil {
		b.Fatal(err)
	}
	got := make(chan time.Time, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				cs, err := wq.ClaimWait(ctx, 1, time.Minute)
				if err != nil {
					return
				}
				at := time.Now()
				for _, c := range cs {
					_ = c.Ack(ctx)
				}
				got <- at
			}
		})
	}
	xacts := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	time.Sleep(100 * time.Millisecond) // the workers are waiting
	lat := make([]time.Duration, 0, b.N)
	x0 := xacts()
	b.ResetTimer()
	for i := range b.N {
		sent := time.Now()
		if _, err := producer.Enqueue(ctx, fmt.Sprint("t", i), nil); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-got).Sub(sent))
		time.Sleep(5 * time.Millisecond) // idle again
	}
	b.StopTimer()
	time.Sleep(50 * time.Millisecond) // the stragglers' statements
	x1 := xacts()
	cancel()
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(x1-x0-2)/float64(b.N), "xacts/task")
}
