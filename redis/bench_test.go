package redis_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
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
