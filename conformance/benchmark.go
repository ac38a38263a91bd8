package conformance

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// Benchmark measures a driver through its harness, as sub-benchmarks:
//
//   - AcquireRelease: one locker, TryAcquire + Release of one name, the
//     watchdog on (the default); reports p50-ns and p99-ns per cycle.
//   - Independent: parallel workers, each with its own locker and name.
//   - Contended: 8 lockers on one name, blocking Acquire + Release; reports
//     fairness (the smallest per-locker count over the largest).
//
// Compare the figures with the backend's raw client in the same run (see
// `dlock bench`, which does that for every backend it knows).
func Benchmark(b *testing.B, h Harness) {
	ttl := 10 * time.Second
	opts := &dlock.Options{TTL: ttl}
	b.Run("AcquireRelease", func(b *testing.B) {
		l := benchLocker(b, h, opts)
		name := benchName(b)
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			ls, err := l.TryAcquire(ctx, name, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := ls.Release(ctx); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	})
	b.Run("Independent", func(b *testing.B) {
		var mu sync.Mutex
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			l := benchLocker(b, h, opts)
			name := benchName(b)
			mu.Unlock()
			ctx := context.Background()
			for pb.Next() {
				ls, err := l.TryAcquire(ctx, name, nil)
				if err != nil {
					b.Error(err)
					return
				}
				if err := ls.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Contended", func(b *testing.B) {
		const workers = 8
		name := benchName(b)
		lockers := make([]*dlock.Locker, workers)
		for i := range lockers {
			lockers[i] = benchLocker(b, h, opts)
		}
		ctx := context.Background()
		var left atomic.Int64
		left.Store(int64(b.N))
		counts := make([]int, workers)
		var wg sync.WaitGroup
		b.ResetTimer()
		for i, l := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					ls, err := l.Acquire(ctx, name, nil)
					if err != nil {
						b.Error(err)
						return
					}
					counts[i]++
					if err := ls.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		if lo, hi := slices.Min(counts), slices.Max(counts); hi > 0 {
			b.ReportMetric(float64(lo)/float64(hi), "fairness")
		}
	})
}

func benchLocker(b *testing.B, h Harness, opts *dlock.Options) *dlock.Locker {
	l, _ := h.NewLocker(b, opts)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			b.Errorf("Close: %v", err)
		}
	})
	return l
}

var benchSeq atomic.Int64

func benchName(b *testing.B) string {
	return fmt.Sprintf("dlock-bench/%s/%d/%d", b.Name(), time.Now().UnixNano(), benchSeq.Add(1))
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
