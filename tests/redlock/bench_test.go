package redlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/redis"
	"github.com/dlock/dlock/redlock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

// The benchmarks compare one lock/unlock cycle through the redlock driver on
// 5 nodes with, in the same run and on the same servers:
//
//   - floor: the raw Redlock of the Redis documentation (as redsync does
//     it): SET NX PX on every node at once, waiting for every answer, then
//     the compare-and-delete script on every node at once;
//   - redis: the single-node redis driver's cycle on the first node.
//
// BenchmarkRatio interleaves the three so that drift and load weigh on all
// alike, and reports each p50 and the ratios redlock/floor and
// redlock/redis (the bound: redlock p50 ≤ 2.5× redis p50).
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench Ratio -benchtime 3000x ./redlock/

var rawRelease = goredis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// benchCluster is 5 servers for the whole benchmark binary's run.
var benchCluster = sync.OnceValues(func() ([]*servers.Server, error) {
	srvs := make([]*servers.Server, 5)
	errs := make([]error, 5)
	var wg sync.WaitGroup
	for i := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srvs[i], errs[i] = servers.Start(context.Background(), servers.Redis, nil)
		}()
	}
	wg.Wait()
	return srvs, errors.Join(errs...) // CloseAll in TestMain removes them
})

func benchClients(b *testing.B) []goredis.UniversalClient {
	b.Helper()
	if testing.Short() {
		b.Skip("needs 5 Redis servers")
	}
	srvs, err := benchCluster()
	if err != nil {
		b.Fatal(err)
	}
	cs := make([]goredis.UniversalClient, len(srvs))
	for i, s := range srvs {
		c := newClient(b, s.Addr())
		if err := c.Ping(context.Background()).Err(); err != nil { // warm the pool
			b.Fatal(err)
		}
		cs[i] = c
	}
	return cs
}

// floorCycle is one raw Redlock lock and unlock of key on every node.
func floorCycle(ctx context.Context, cs []goredis.UniversalClient, key, token string) error {
	var wg sync.WaitGroup
	oks := make([]bool, len(cs))
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oks[i], _ = c.SetNX(ctx, key, token, dlock.DefaultTTL).Result()
		}()
	}
	wg.Wait()
	n := 0
	for _, ok := range oks {
		if ok {
			n++
		}
	}
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rawRelease.Run(ctx, c, []string{key}, token).Err()
		}()
	}
	wg.Wait()
	if n < len(cs)/2+1 {
		return errors.New("floor: no majority")
	}
	return nil
}

func cycle(ctx context.Context, l *dlock.Locker, name string) error {
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		return err
	}
	return ls.Release(ctx)
}

func p50(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkAcquireRelease is TryAcquire then Release with the watchdog on
// (the default), in each layout; ns/op is one cycle.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, compat := range []bool{false, true} {
		b.Run("compat="+strconv.FormatBool(compat), func(b *testing.B) {
			ctx := context.Background()
			l := newLocker(b, benchClients(b), &redlock.Options{Compat: compat, KeyPrefix: "dlockbench:" + randomHex(4) + ":"})
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if err := cycle(ctx, l, "bench"); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			b.ReportMetric(float64(p50(lat).Nanoseconds()), "p50-ns")
		})
	}
}

// BenchmarkRatio alternates a redlock cycle, a raw floor cycle and a
// single-node redis driver cycle; ns/op covers all three.
func BenchmarkRatio(b *testing.B) {
	ctx := context.Background()
	cs := benchClients(b)
	prefix := "dlockbench:" + randomHex(4) + ":"
	rl := newLocker(b, cs, &redlock.Options{KeyPrefix: prefix})
	rd, err := redis.New(cs[0], &redis.Options{KeyPrefix: prefix + "single:"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rd.Close(ctx) })
	for _, warm := range []func() error{
		func() error { return cycle(ctx, rl, "ratio") },
		func() error { return floorCycle(ctx, cs, prefix+"floor", "warm") },
		func() error { return cycle(ctx, rd, "ratio") },
	} {
		if err := warm(); err != nil {
			b.Fatal(err)
		}
	}
	var lr, lf, ls []time.Duration
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if err := cycle(ctx, rl, "ratio"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := floorCycle(ctx, cs, prefix+"floor", strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := cycle(ctx, rd, "ratio"); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		lr, lf, ls = append(lr, t1.Sub(t0)), append(lf, t2.Sub(t1)), append(ls, t3.Sub(t2))
	}
	b.StopTimer()
	r, f, s := p50(lr), p50(lf), p50(ls)
	b.ReportMetric(float64(r.Nanoseconds()), "redlock-p50-ns")
	b.ReportMetric(float64(f.Nanoseconds()), "floor-p50-ns")
	b.ReportMetric(float64(s.Nanoseconds()), "redis-p50-ns")
	b.ReportMetric(float64(r)/float64(f), "redlock/floor")
	b.ReportMetric(float64(r)/float64(s), "redlock/redis")
}

// BenchmarkPeers alternates, in a random order each iteration, a dlock
// cycle on the 5 nodes (default options, the watchdog on) and a
// go-redsync cycle (TryLockContext, UnlockContext; one pool per node, its
// own clients made alike), and reports each p50 and mean, the p50 of the
// acquisition alone, and the ratios dlock/redsync (issue 22: p50 ≤ 1.05×,
// mean ≤ 1/0.95×). The CPU
// profile's samples carry a label "client" naming whose cycle they are
// (go tool pprof -tagfocus client=dlock).
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench Peers -benchtime 3000x ./redlock/
func BenchmarkPeers(b *testing.B) {
	ctx := context.Background()
	cs := benchClients(b)
	prefix := "dlockbench:" + randomHex(4) + ":"
	l := newLocker(b, cs, &redlock.Options{KeyPrefix: prefix})
	pools := make([]redsyncredis.Pool, len(cs))
	for i, c := range cs {
		pc := newClient(b, c.(*goredis.Client).Options().Addr)
		if err := pc.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		pools[i] = redsyncgoredis.NewPool(pc)
	}
	rs := redsync.New(pools...)
	acqs := make([][]time.Duration, 2)
	cycles := []struct {
		name string
		run  func() error
	}{
		{"dlock", func() error {
			t := time.Now()
			ls, err := l.TryAcquire(ctx, "peers", nil)
			if err != nil {
				return err
			}
			acqs[0] = append(acqs[0], time.Since(t))
			return ls.Release(ctx)
		}},
		{"redsync", func() error {
			t := time.Now()
			m := rs.NewMutex(prefix+"redsync", redsync.WithExpiry(dlock.DefaultTTL))
			if err := m.TryLockContext(ctx); err != nil {
				return err
			}
			acqs[1] = append(acqs[1], time.Since(t))
			_, err := m.UnlockContext(ctx)
			return err
		}},
	}
	lat := make([][]time.Duration, len(cycles))
	sums := make([]time.Duration, len(cycles))
	labels := make([]context.Context, len(cycles))
	for i, c := range cycles {
		labels[i] = pprof.WithLabels(ctx, pprof.Labels("client", c.name))
		lat[i] = make([]time.Duration, 0, b.N)
		for range 20 { // warm up: scripts loaded, pools dialled
			if err := c.run(); err != nil {
				b.Fatal(err)
			}
		}
	}
	acqs[0], acqs[1] = acqs[0][:0], acqs[1][:0]
	b.ResetTimer()
	for range b.N {
		for _, k := range rand.Perm(len(cycles)) { // no one always follows the same
			pprof.SetGoroutineLabels(labels[k])
			start := time.Now()
			if err := cycles[k].run(); err != nil {
				b.Fatalf("%s: %v", cycles[k].name, err)
			}
			d := time.Since(start)
			lat[k] = append(lat[k], d)
			sums[k] += d
		}
	}
	b.StopTimer()
	pprof.SetGoroutineLabels(ctx)
	for i, c := range cycles {
		b.ReportMetric(float64(p50(lat[i]).Nanoseconds()), c.name+"-p50-ns")
		b.ReportMetric(float64(sums[i].Nanoseconds())/float64(b.N), c.name+"-mean-ns")
	}
	b.ReportMetric(float64(p50(lat[0]))/float64(p50(lat[1])), "p50/redsync")
	b.ReportMetric(float64(p50(acqs[0])), "dlock-acq-p50-ns")
	b.ReportMetric(float64(p50(acqs[1])), "redsync-acq-p50-ns")
	b.ReportMetric(float64(sums[0])/float64(sums[1]), "mean/redsync")
}
