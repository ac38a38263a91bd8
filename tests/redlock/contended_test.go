package redlock_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

const contendedWorkers = 8

// contend runs cycle on contendedWorkers workers until n cycles have
// succeeded in all (a few more may finish), and returns the elapsed time and the per-worker counts
// of successful cycles.
func contend(n int, cycle func(w int) bool) (time.Duration, []int) {
	var left atomic.Int64
	left.Store(int64(n))
	counts := make([]int, contendedWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range contendedWorkers {
		wg.Go(func() {
			for left.Load() > 0 {
				if cycle(w) {
					counts[w]++
					left.Add(-1)
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), counts
}

// BenchmarkContended: 8 workers looping on one name over the same 5 nodes,
// dlock (Acquire + Release, each worker its own Locker and clients) and
// go-redsync's default mutex (Lock + Unlock, each worker its own redsync
// instance and clients), in alternating rounds. It reports both
// throughputs, their ratio, and each side's fairness (the smallest
// per-worker count of acquisitions over the largest). A redsync Lock that
// gives up (ErrFailed after its 32 tries) is counted as no acquisition.
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench Contended -benchtime 2000x ./redlock/
func BenchmarkContended(b *testing.B) {
	ctx := context.Background()
	prefix := "dlockbench:" + randomHex(4) + ":"
	lockers := make([]*dlock.Locker, contendedWorkers)
	mutexes := make([]*redsync.Mutex, contendedWorkers)
	for w := range contendedWorkers {
		lockers[w] = newLocker(b, benchClients(b), &redlock.Options{KeyPrefix: prefix})
		cs := benchClients(b)
		pools := make([]redsyncredis.Pool, len(cs))
		for i, c := range cs {
			pools[i] = redsyncgoredis.NewPool(c)
		}
		mutexes[w] = redsync.New(pools...).NewMutex(prefix + "redsync")
	}
	dlockCycle := func(w int) bool {
		ls, err := lockers[w].Acquire(ctx, "contended", nil)
		if err != nil {
			b.Error(err)
			return false
		}
		if err := ls.Release(ctx); err != nil {
			b.Error(err)
		}
		return true
	}
	redsyncCycle := func(w int) bool {
		if err := mutexes[w].LockContext(ctx); err != nil {
			return false
		}
		if ok, err := mutexes[w].UnlockContext(ctx); !ok || err != nil {
			b.Errorf("redsync Unlock: %v, %v", ok, err)
		}
		return true
	}
	var dlockTime, redsyncTime time.Duration
	var dlockCmds, redsyncCmds int64
	dlockCounts := make([]int, contendedWorkers)
	redsyncCounts := make([]int, contendedWorkers)
	stats := benchClients(b)
	round := func(cycle func(int) bool, total *time.Duration, cmds *int64, counts []int, n int) {
		before := commandsProcessed(b, stats)
		d, c := contend(n, cycle)
		*total += d
		*cmds += commandsProcessed(b, stats) - before
		for i := range c {
			counts[i] += c[i]
		}
	}
	// Short rounds, which of the two goes first alternating, so that the
	// machine's drifts weigh on both alike.
	const rounds = 10
	b.ResetTimer()
	for r := range rounds {
		n := b.N / rounds
		if r == 0 {
			n += b.N % rounds
		}
		if r%2 == 0 {
			round(dlockCycle, &dlockTime, &dlockCmds, dlockCounts, n)
			round(redsyncCycle, &redsyncTime, &redsyncCmds, redsyncCounts, n)
		} else {
			round(redsyncCycle, &redsyncTime, &redsyncCmds, redsyncCounts, n)
			round(dlockCycle, &dlockTime, &dlockCmds, dlockCounts, n)
		}
	}
	b.StopTimer()
	dOps := float64(sum(dlockCounts)) / dlockTime.Seconds()
	rOps := float64(sum(redsyncCounts)) / redsyncTime.Seconds()
	b.ReportMetric(dOps, "dlock-ops/s")
	b.ReportMetric(rOps, "redsync-ops/s")
	b.ReportMetric(dOps/rOps, "ops-ratio")
	b.ReportMetric(fairness(dlockCounts), "dlock-fairness")
	b.ReportMetric(fairness(redsyncCounts), "redsync-fairness")
	b.ReportMetric(float64(dlockCmds)/float64(sum(dlockCounts)), "dlock-cmds/acq")
	b.ReportMetric(float64(redsyncCmds)/float64(sum(redsyncCounts)), "redsync-cmds/acq")
}

// commandsProcessed sums the commands the nodes have processed (INFO's
// total_commands_processed; a script counts once), to show each side's
// server work per acquisition.
func commandsProcessed(b *testing.B, cs []goredis.UniversalClient) int64 {
	var n int64
	for _, c := range cs {
		info, err := c.Info(context.Background(), "stats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				n += x
			}
		}
	}
	return n
}

func sum(counts []int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// fairness is the smallest count over the largest.
func fairness(counts []int) float64 {
	if hi := slices.Max(counts); hi > 0 {
		return float64(slices.Min(counts)) / float64(hi)
	}
	return 0
}

// BenchmarkHandoff: a waiter blocked in Acquire (given 5ms to get there),
// the holder releases at t0, the waiter's Acquire returns at t1; it reports
// the p50 of t1-t0.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	prefix := "dlockbench:" + randomHex(4) + ":"
	holder := newLocker(b, benchClients(b), &redlock.Options{KeyPrefix: prefix})
	waiter := newLocker(b, benchClients(b), &redlock.Options{KeyPrefix: prefix})
	type result struct {
		ls  *dlock.Lease
		err error
		at  time.Time
	}
	var hand []time.Duration
	b.ResetTimer()
	for range b.N {
		ls, err := holder.Acquire(ctx, "handoff", nil)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan result, 1)
		go func() {
			lw, err := waiter.Acquire(ctx, "handoff", nil)
			got <- result{lw, err, time.Now()}
		}()
		time.Sleep(5 * time.Millisecond)
		t0 := time.Now()
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			b.Fatal(r.err)
		}
		hand = append(hand, r.at.Sub(t0))
		if err := r.ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(p50(hand).Nanoseconds()), "handoff-p50-ns")
}
