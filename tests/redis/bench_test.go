package redis_test

import (
	"context"
	"github.com/dlock/dlock/internal/testexport/redisexport"
	"math/rand/v2"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

// The benchmarks compare one lock/unlock cycle through dlock with the raw
// floor on the same client and server: SET NX PX, then a compare-and-delete
// script. Each reports ns/op and its p50 and p99 per cycle; read the ratio
// off BenchmarkAcquireRelease/default against BenchmarkRawFloor/setnx
// (or BenchmarkRatio, which interleaves the two to cancel drift).

var rawReleaseScript = goredis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// latencies records one duration per iteration and reports percentiles.
type latencies []time.Duration

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(l[len(l)*99/100].Nanoseconds()), prefix+"p99-ns")
}

func benchClient(b *testing.B) *goredis.Client {
	c := newClient(b, redisAddr(b))
	if err := c.Ping(context.Background()).Err(); err != nil { // warm the pool
		b.Fatal(err)
	}
	return c
}

func benchName(b *testing.B, unique bool, i int) string {
	if unique {
		return "bench-" + strconv.Itoa(i)
	}
	return "bench"
}

// BenchmarkAcquireRelease is TryAcquire then Release, with the watchdog on
// (the default), on one name or on a new name each iteration.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, bc := range []struct {
		name   string
		compat bool
		unique bool
	}{
		{"default", false, false},
		{"default-unique-names", false, true},
		{"compat", true, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			c := benchClient(b)
			prefix := "dlockbench:" + randomHex(4) + ":"
			l, err := redis.New(c, &redis.Options{KeyPrefix: prefix, Compat: bc.compat})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close(ctx)
			defer cleanupPrefix(c, prefix)
			lat := make(latencies, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				ls, err := l.TryAcquire(ctx, benchName(b, bc.unique, i), nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := ls.Release(ctx); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			lat.report(b, "")
		})
	}
}

// BenchmarkRawFloor is the same cycle written directly against go-redis:
// SET NX PX with a fixed value, then the compare-and-delete script by
// EVALSHA. No token generation, no fencing, no notification.
func BenchmarkRawFloor(b *testing.B) {
	for _, unique := range []bool{false, true} {
		name := "setnx"
		if unique {
			name = "setnx-unique-names"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			c := benchClient(b)
			prefix := "dlockbench:" + randomHex(4) + ":"
			defer cleanupPrefix(c, prefix)
			lat := make(latencies, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				rawCycle(b, ctx, c, prefix+benchName(b, unique, i))
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			lat.report(b, "")
		})
	}
}

func rawCycle(b *testing.B, ctx context.Context, c *goredis.Client, key string) {
	ok, err := c.SetNX(ctx, key, "0123456789abcdef0123456789abcdef", dlock.DefaultTTL).Result()
	if err != nil || !ok {
		b.Fatalf("SET NX: %v, %v", ok, err)
	}
	n, err := rawReleaseScript.Run(ctx, c, []string{key}, "0123456789abcdef0123456789abcdef").Int64()
	if err != nil || n != 1 {
		b.Fatalf("release: %v, %v", n, err)
	}
}

// BenchmarkRatio alternates a dlock cycle and a raw cycle on one client and
// reports both p50s and their ratio (dlock/raw); ns/op covers both cycles.
func BenchmarkRatio(b *testing.B) {
	ctx := context.Background()
	c := benchClient(b)
	prefix := "dlockbench:" + randomHex(4) + ":"
	l, err := redis.New(c, &redis.Options{KeyPrefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	defer cleanupPrefix(c, prefix)
	dl := make(latencies, 0, b.N)
	raw := make(latencies, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		ls, err := l.TryAcquire(ctx, "ratio", nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		rawCycle(b, ctx, c, prefix+"raw")
		dl = append(dl, mid.Sub(start))
		raw = append(raw, time.Since(mid))
	}
	b.StopTimer()
	slices.Sort(dl)
	slices.Sort(raw)
	p50d, p50r := dl[len(dl)/2], raw[len(raw)/2]
	b.ReportMetric(float64(p50d.Nanoseconds()), "dlock-p50-ns")
	b.ReportMetric(float64(p50r.Nanoseconds()), "raw-p50-ns")
	b.ReportMetric(float64(p50d)/float64(p50r), "p50-ratio")
}

// cleanupPrefix deletes every key under prefix (fencing counters included).
func cleanupPrefix(c *goredis.Client, prefix string) {
	ctx := context.Background()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		c.Del(ctx, keys[:n]...)
		keys = keys[n:]
	}
}

// BenchmarkPeers runs, in a random order each iteration (so that no one
// always follows the same, say redsync's goroutines winding down), a dlock
// cycle (default options, the watchdog on), the same two scripts sent
// without the Locker ("scripts": what is left of dlock's cycle is the
// engine's and the driver's Go code), a bsm/redislock cycle (Obtain,
// Release) and a go-redsync cycle (TryLockContext, UnlockContext; one pool),
// each on a client of its own made alike. It reports each p50 and mean,
// heap allocations and process CPU per cycle, the p50s of the time spent
// inside go-redis's Process (the round trips: network and server) and
// outside it (the library's own Go code), and dlock over the best peer
// (issue 22: p50 ≤ 1.05×, mean ≤ 1/0.95×). The CPU profile's samples carry a label "client"
// naming whose cycle they are (go tool pprof -tagfocus client=dlock).
//
//	go test -run '^$' -bench Peers -benchtime 5000x -cpuprofile cpu.out ./redis/
func BenchmarkPeers(b *testing.B) {
	ctx := context.Background()
	addr := redisAddr(b)
	prefix := "dlockbench:" + randomHex(4) + ":"
	dc, wc, rc, sc := benchClientAt(b, addr), benchClientAt(b, addr), benchClientAt(b, addr), benchClientAt(b, addr)
	var inProcess time.Duration // of the cycle running
	for _, c := range []*goredis.Client{dc, wc, rc, sc} {
		c.AddHook(processTimer{&inProcess})
	}
	l, err := redis.New(dc, &redis.Options{KeyPrefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	defer cleanupPrefix(dc, prefix)
	rl := redislock.New(rc)
	rs := redsync.New(redsyncgoredis.NewPool(sc))
	wkeys := []string{prefix + "{scripts}", prefix + "{scripts}:fence", prefix + "{scripts}:queue", prefix + "{scripts}:waiters", prefix + "{scripts}:meta"}
	cycles := []struct {
		name string
		run  func() error
	}{
		{"dlock", func() error {
			ls, err := l.TryAcquire(ctx, "peers", nil)
			if err != nil {
				return err
			}
			return ls.Release(ctx)
		}},
		{"scripts", func() error {
			tok := "0123456789abcdef0123456789abcdef"
			if err := redisexport.AcquireScript.Run(ctx, wc, wkeys, tok, dlock.DefaultTTL.Milliseconds(), 0).Err(); err != nil {
				return err
			}
			return redisexport.ReleaseScript.Run(ctx, wc, wkeys, tok).Err()
		}},
		{"redislock", func() error {
			lk, err := rl.Obtain(ctx, prefix+"redislock", dlock.DefaultTTL, nil)
			if err != nil {
				return err
			}
			return lk.Release(ctx)
		}},
		{"redsync", func() error {
			m := rs.NewMutex(prefix+"redsync", redsync.WithExpiry(dlock.DefaultTTL))
			if err := m.TryLockContext(ctx); err != nil {
				return err
			}
			_, err := m.UnlockContext(ctx)
			return err
		}},
	}
	const peers = 2 // the last two
	ms := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	allocs := make([]uint64, len(cycles))
	lat := make([]latencies, len(cycles))
	sums := make([]time.Duration, len(cycles))
	cpu := make([]time.Duration, len(cycles))
	in, out := make([]latencies, len(cycles)), make([]latencies, len(cycles))
	labels := make([]context.Context, len(cycles))
	for i, c := range cycles {
		labels[i] = pprof.WithLabels(ctx, pprof.Labels("client", c.name))
		lat[i] = make(latencies, 0, b.N)
		for range 100 { // warm up: scripts loaded, pools dialled
			if err := c.run(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, k := range rand.Perm(len(cycles)) {
			pprof.SetGoroutineLabels(labels[k])
			metrics.Read(ms)
			a := ms[0].Value.Uint64()
			inProcess = 0
			c0, start := processCPU(), time.Now()
			if err := cycles[k].run(); err != nil {
				b.Fatalf("%s: %v", cycles[k].name, err)
			}
			d := time.Since(start)
			cpu[k] += processCPU() - c0
			metrics.Read(ms)
			allocs[k] += ms[0].Value.Uint64() - a
			lat[k] = append(lat[k], d)
			in[k], out[k] = append(in[k], inProcess), append(out[k], d-inProcess)
			sums[k] += d
		}
	}
	b.StopTimer()
	pprof.SetGoroutineLabels(ctx)
	p50 := make([]time.Duration, len(cycles))
	bestP50, bestMean := time.Duration(0), time.Duration(0)
	for i, c := range cycles {
		slices.Sort(lat[i])
		p50[i] = lat[i][len(lat[i])/2]
		b.ReportMetric(float64(p50[i].Nanoseconds()), c.name+"-p50-ns")
		b.ReportMetric(float64(sums[i].Nanoseconds())/float64(b.N), c.name+"-mean-ns")
		b.ReportMetric(float64(allocs[i])/float64(b.N), c.name+"-allocs")
		b.ReportMetric(float64(cpu[i].Nanoseconds())/float64(b.N), c.name+"-cpu-ns")
		in[i].report(b, c.name+"-in-")
		out[i].report(b, c.name+"-out-")
		if i >= len(cycles)-peers {
			if bestP50 == 0 || p50[i] < bestP50 {
				bestP50 = p50[i]
			}
			if bestMean == 0 || sums[i] < bestMean {
				bestMean = sums[i]
			}
		}
	}
	b.ReportMetric(float64(p50[0])/float64(bestP50), "p50/best")
	b.ReportMetric(float64(sums[0])/float64(bestMean), "mean/best")
}

// benchClientAt is a client of its own on addr, its pool warmed.
func benchClientAt(b *testing.B, addr string) *goredis.Client {
	c := newClient(b, addr)
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	return c
}

// processTimer adds the time each command spends in go-redis's Process
// (the connection, the network, the server) to *d.
type processTimer struct{ d *time.Duration }

func (h processTimer) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h processTimer) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h processTimer) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		*h.d += time.Since(start)
		return err
	}
}
