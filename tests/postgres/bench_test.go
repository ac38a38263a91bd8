package postgres_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
)

// The benchmarks compare dlock with the raw floor on the same server, in the
// same run:
//
//   - uncontended: TryAcquire + Release against pg_try_advisory_lock +
//     pg_advisory_unlock on a pinned connection (BenchmarkRatio interleaves
//     the two and reports the p50 ratio);
//   - contended: 8 workers, each with its own Locker, Acquire + Release on
//     one name, against 8 pinned connections looping pg_advisory_lock +
//     pg_advisory_unlock (blocking, the server's queue), the floor that
//     `dlock bench` cannot express (its floors wait by spinning attempts);
//   - handoff: a waiter blocked in Acquire, the holder releases: the time
//     until the waiter's Acquire returns, against its own uncontended p50.
//
// Run them on a quiet machine, e.g.
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench . -benchtime 3s ./postgres/

// latencies records one duration per iteration and reports percentiles.
type latencies []time.Duration

func (l latencies) p50() time.Duration {
	slices.Sort(l)
	return l[len(l)/2]
}

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(l[len(l)*99/100].Nanoseconds()), prefix+"p99-ns")
}

// variants are the driver configurations benchmarked.
var variants = []struct {
	name string
	opts *postgres.Options
}{
	{"default", nil},
	{"nofencing", &postgres.Options{NoFencing: true}},
}

func benchLocker(b *testing.B, opts *postgres.Options) *dlock.Locker {
	srv := servers.Require(b, servers.Postgres)
	l := newLocker(b, srv.Addr(), opts)
	ls, err := l.TryAcquire(context.Background(), uniqueName(b), nil) // warm the pool
	if err != nil {
		b.Fatal(err)
	}
	if err := ls.Release(context.Background()); err != nil {
		b.Fatal(err)
	}
	return l
}

// rawCycle is the floor: pg_try_advisory_lock + pg_advisory_unlock.
func rawCycle(b *testing.B, ctx context.Context, c *pgx.Conn, name string) {
	var ok, unlocked bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", name).Scan(&ok); err != nil || !ok {
		b.Fatalf("pg_try_advisory_lock: %v, %v", ok, err)
	}
	if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", name).Scan(&unlocked); err != nil || !unlocked {
		b.Fatalf("pg_advisory_unlock: %v, %v", unlocked, err)
	}
}

func dlockCycle(b *testing.B, ctx context.Context, l *dlock.Locker, name string) {
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := ls.Release(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAcquireRelease is TryAcquire then Release, the watchdog on.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			l := benchLocker(b, v.opts)
			name := uniqueName(b)
			lat := make(latencies, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				dlockCycle(b, ctx, l, name)
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			lat.report(b, "")
		})
	}
}

// BenchmarkRawFloor is the floor cycle on a pinned connection.
func BenchmarkRawFloor(b *testing.B) {
	ctx := context.Background()
	c := rawConn(b, servers.Require(b, servers.Postgres).Addr())
	name := uniqueName(b)
	rawCycle(b, ctx, c, name)
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		rawCycle(b, ctx, c, name)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	lat.report(b, "")
}

// BenchmarkRatio alternates a dlock cycle and a floor cycle and reports both
// p50s and their ratio (dlock/floor); ns/op covers both cycles.
func BenchmarkRatio(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			l := benchLocker(b, v.opts)
			c := rawConn(b, servers.Require(b, servers.Postgres).Addr())
			name, rawName := uniqueName(b), uniqueName(b)
			rawCycle(b, ctx, c, rawName)
			dl := make(latencies, 0, b.N)
			raw := make(latencies, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				dlockCycle(b, ctx, l, name)
				mid := time.Now()
				rawCycle(b, ctx, c, rawName)
				dl = append(dl, mid.Sub(start))
				raw = append(raw, time.Since(mid))
			}
			b.StopTimer()
			p50d, p50r := dl.p50(), raw.p50()
			b.ReportMetric(float64(p50d.Nanoseconds()), "dlock-p50-ns")
			b.ReportMetric(float64(p50r.Nanoseconds()), "raw-p50-ns")
			b.ReportMetric(float64(p50d)/float64(p50r), "p50-ratio")
		})
	}
}

const contendedWorkers = 8

// contend runs cycle on contendedWorkers workers until n cycles are done in
// all and returns the elapsed time and the per-worker counts.
func contend(n int, cycle func(w int)) (time.Duration, []int) {
	var left atomic.Int64
	left.Store(int64(n))
	counts := make([]int, contendedWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range contendedWorkers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				cycle(w)
				counts[w]++
			}
		})
	}
	wg.Wait()
	return time.Since(start), counts
}

// BenchmarkContended: 8 workers on one name, dlock (Acquire + Release, one
// Locker each) and the blocking floor (pg_advisory_lock +
// pg_advisory_unlock, one pinned connection each), in alternating rounds;
// it reports both throughputs, their ratio and dlock's fairness (the
// smallest per-worker count over the largest).
func BenchmarkContended(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			addr := servers.Require(b, servers.Postgres).Addr()
			lockers := make([]*dlock.Locker, contendedWorkers)
			conns := make([]*pgx.Conn, contendedWorkers)
			for i := range lockers {
				lockers[i] = benchLocker(b, v.opts)
				conns[i] = rawConn(b, addr)
			}
			name, rawName := uniqueName(b), uniqueName(b)
			var dlockTime, rawTime time.Duration
			dlockCounts := make([]int, contendedWorkers)
			dlockRound := func(n int) {
				d, counts := contend(n, func(w int) {
					ls, err := lockers[w].Acquire(ctx, name, nil)
					if err != nil {
						b.Error(err)
						return
					}
					if err := ls.Release(ctx); err != nil {
						b.Error(err)
					}
				})
				dlockTime += d
				for i, c := range counts {
					dlockCounts[i] += c
				}
			}
			rawRound := func(n int) {
				d, _ := contend(n, func(w int) {
					if _, err := conns[w].Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", rawName); err != nil {
						b.Error(err)
						return
					}
					if _, err := conns[w].Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", rawName); err != nil {
						b.Error(err)
					}
				})
				rawTime += d
			}
			// Many short rounds, which of the two goes first alternating, so
			// that the machine's drifts weigh on both alike.
			const rounds = 10
			b.ResetTimer()
			for r := range rounds {
				n := b.N / rounds
				if r == 0 {
					n += b.N % rounds
				}
				if r%2 == 0 {
					dlockRound(n)
					rawRound(n)
				} else {
					rawRound(n)
					dlockRound(n)
				}
			}
			b.StopTimer()
			dOps := float64(b.N) / dlockTime.Seconds()
			rOps := float64(b.N) / rawTime.Seconds()
			b.ReportMetric(dOps, "dlock-ops/s")
			b.ReportMetric(rOps, "raw-ops/s")
			b.ReportMetric(dOps/rOps, "ops-ratio")
			if lo, hi := slices.Min(dlockCounts), slices.Max(dlockCounts); hi > 0 {
				b.ReportMetric(float64(lo)/float64(hi), "fairness")
			}
		})
	}
}

// BenchmarkHandoff: a waiter blocked in Acquire (given 5ms to get there),
// the holder releases at t0, the waiter's Acquire returns at t1; it reports
// the p50 of t1-t0, the p50 of an uncontended cycle measured alongside, and
// their ratio.
func BenchmarkHandoff(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			holder, waiter := benchLocker(b, v.opts), benchLocker(b, v.opts)
			name, other := uniqueName(b), uniqueName(b)
			hand := make(latencies, 0, b.N)
			unc := make(latencies, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				dlockCycle(b, ctx, holder, other)
				unc = append(unc, time.Since(start))

				ls, err := holder.TryAcquire(ctx, name, nil)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan result, 1)
				go func() {
					lw, err := waiter.Acquire(ctx, name, nil)
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
			ph, pu := hand.p50(), unc.p50()
			b.ReportMetric(float64(ph.Nanoseconds()), "handoff-p50-ns")
			b.ReportMetric(float64(pu.Nanoseconds()), "unc-p50-ns")
			b.ReportMetric(float64(ph)/float64(pu), "handoff/unc")
		})
	}
}
