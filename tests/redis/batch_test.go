package redis_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/redisexport"
	"github.com/dlock/dlock/tests/internal/testutil"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/redis"
)

// scriptCounter counts the script calls of refresh.lua and
// refresh_batch.lua (told apart by the number of lease tokens in ARGV).
type scriptCounter struct {
	single, batch, batched atomic.Int64
	refreshSHA, batchSHA   string
}

func (c *scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (c *scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (c *scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if args := cmd.Args(); len(args) > 2 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			switch args[1] {
			case c.refreshSHA:
				c.single.Add(1)
			case c.batchSHA:
				c.batch.Add(1)
				c.batched.Add(int64((len(args) - 3) / 4)) // one key and three arguments per lease here
			}
		}
		return next(ctx, cmd)
	}
}

// The watchdog refreshes many leases of one Locker in few script calls;
// a lock taken away loses only its own lease.
func TestBatchedRefreshOnServer(t *testing.T) {
	raw := newClient(t, redisAddr(t))
	counter := &scriptCounter{
		refreshSHA: redisexport.RefreshSHA,
		batchSHA:   redisexport.RefreshBatchSHA,
	}
	keyPrefix := testPrefix(t, raw)
	l := newLocker(t, newClient(t, redisAddr(t), counter), &redis.Options{KeyPrefix: keyPrefix})
	ctx := testutil.Ctx(t)
	prefix := "batch-" + testutil.RandomHex(4) + "-"
	const n = 300
	// The TTL is a liveness bound: every lease must outlive any stall of
	// this process or its batch call. At 600ms, a 500ms stall (a loaded
	// machine's scheduler, the race detector's GC with 300 leases) lost
	// every lease at once and the test reported "refreshes stopped".
	ttl, err := conformance.Live(3 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("%s%d", prefix, i), &dlock.Options{TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	// The locks outlive a failure, so that none is left behind.
	t.Cleanup(func() {
		for _, ls := range leases {
			_ = ls.Release(context.Background())
		}
		raw.Del(context.Background(), keyPrefix+"{"+prefix+"7}")
	})
	// ended fails the test with the leases that ended, if any.
	ended := func(what string) {
		t.Helper()
		var lost []string
		for i, ls := range leases {
			if i != 7 && ls.Err() != nil {
				lost = append(lost, fmt.Sprintf("%d: %v", i, ls.Err()))
			}
		}
		if len(lost) > 0 {
			t.Fatalf("%s: %d leases ended, the first %v", what, len(lost), lost[0])
		}
	}
	// Three rounds of refreshes (every TTL/3).
	for end := time.Now().Add(30 * time.Second); counter.batched.Load()+counter.single.Load() < 3*n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			ended("too few refreshes")
			t.Fatalf("only %d refreshes in 30s", counter.batched.Load()+counter.single.Load())
		}
	}
	single, calls, batched := counter.single.Load(), counter.batch.Load(), counter.batched.Load()
	t.Logf("%d refreshes in %d batch calls, %d alone", batched, calls, single)
	if single > batched/10 || calls > batched/4 {
		t.Errorf("%d refreshes in %d batch calls and %d alone: want most in batches", batched, calls, single)
	}
	// Take one lock away: only its lease is lost.
	if err := raw.Set(ctx, keyPrefix+"{"+prefix+"7}", "someone else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases[7].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease whose lock was taken was not lost")
	}
	if !errors.Is(leases[7].Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v", leases[7].Err())
	}
	before := counter.batched.Load()
	for end := time.Now().Add(30 * time.Second); counter.batched.Load() < before+2*n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			ended("refreshes stopped")
			t.Fatal("refreshes stopped")
		}
	}
	ended("after the loss")
	for i, ls := range leases {
		if i != 7 {
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
