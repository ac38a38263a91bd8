package redis_test

import (
	"context"
	"github.com/dlock/dlock/internal/testexport/redisexport"
	"math/rand/v2"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// localReplies answers every script call on the client itself, as a
// server that grants and releases would, without a connection: what is
// left of a cycle is the Go code of the library and of go-redis above the
// connection (no pool, no syscalls, no parsing), so the client-side CPU of
// two libraries can be compared without a network's noise.
type localReplies struct{ acquireSHA, releaseSHA string }

func (h localReplies) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h localReplies) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h localReplies) ProcessHook(goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c, ok := cmd.(*goredis.Cmd)
		if !ok || len(cmd.Args()) < 2 {
			panic("localReplies: unexpected command " + cmd.String())
		}
		switch cmd.Args()[1] {
		case h.acquireSHA:
			c.SetVal(int64(42)) // granted, fence 42
		case h.releaseSHA:
			c.SetVal(int64(1))
		default: // redislock's obtain.lua and release.lua
			c.SetVal("OK")
		}
		return nil
	}
}

// BenchmarkPeersClientSide is BenchmarkPeers' dlock and redislock cycles
// (default options; the dlock one with the watchdog on) on clients whose
// script calls are answered locally (localReplies), in a random order each
// iteration: each library's own CPU and allocations per cycle, with
// go-redis's connection handling left out. ns/op covers both cycles.
//
//	go test -run '^$' -bench PeersClientSide -cpuprofile cpu.out ./redis/
func BenchmarkPeersClientSide(b *testing.B) {
	ctx := context.Background()
	newLocal := func() *goredis.Client {
		c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
		c.AddHook(localReplies{acquireSHA: redisexport.AcquireScript.Hash(), releaseSHA: redisexport.ReleaseScript.Hash()})
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	l, err := redis.New(newLocal(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	rl := redislock.New(newLocal())
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
		{"redislock", func() error {
			lk, err := rl.Obtain(ctx, "redislock", dlock.DefaultTTL, nil)
			if err != nil {
				return err
			}
			return lk.Release(ctx)
		}},
	}
	ms := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	allocs, bytes := make([]uint64, len(cycles)), make([]uint64, len(cycles))
	sums := make([]time.Duration, len(cycles))
	for b.Loop() {
		for _, k := range rand.Perm(len(cycles)) {
			metrics.Read(ms)
			a, by := ms[0].Value.Uint64(), ms[1].Value.Uint64()
			start := time.Now()
			if err := cycles[k].run(); err != nil {
				b.Fatalf("%s: %v", cycles[k].name, err)
			}
			sums[k] += time.Since(start)
			metrics.Read(ms)
			allocs[k] += ms[0].Value.Uint64() - a
			bytes[k] += ms[1].Value.Uint64() - by
		}
	}
	for i, c := range cycles {
		b.ReportMetric(float64(sums[i].Nanoseconds())/float64(b.N), c.name+"-ns")
		b.ReportMetric(float64(allocs[i])/float64(b.N), c.name+"-allocs")
		b.ReportMetric(float64(bytes[i])/float64(b.N), c.name+"-B")
	}
	b.ReportMetric(float64(sums[0])/float64(sums[1]), "dlock/redislock")
}
