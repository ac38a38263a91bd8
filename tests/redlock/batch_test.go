package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/redlockexport"
	"github.com/dlock/dlock/tests/internal/testutil"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
)

// scriptCounter counts one node's calls of refresh.lua and of
// refresh_batch.lua, and the leases those carried.
type scriptCounter struct {
	single, batch, batched atomic.Int64
}

func (c *scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (c *scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (c *scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if args := cmd.Args(); len(args) > 2 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			switch args[1] {
			case redlockexport.RefreshSHA:
				c.single.Add(1)
			case redlockexport.RefreshBatchSHA:
				c.batch.Add(1)
				c.batched.Add(int64((len(args) - 3) / 3)) // one key and two arguments per lease
			}
		}
		return next(ctx, cmd)
	}
}

// The watchdog refreshes many leases of one Locker in one script call per
// node and batch; a lock taken away on a majority loses only its own lease,
// and one taken away on a minority loses nothing.
func TestBatchedRefresh(t *testing.T) {
	c := newCluster(t, 3, nil)
	counter := &scriptCounter{}
	cs := c.clients(t)
	cs[0].AddHook(counter) // node 0's calls stand for every node's
	prefix := "batch-" + testutil.RandomHex(4) + ":"
	l := newLocker(t, cs, &redlock.Options{KeyPrefix: prefix})
	ctx := testutil.Ctx(t)
	const n = 300
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, fmt.Sprint(i), &dlock.Options{TTL: 2 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	// Three rounds of refreshes (every 667ms). At a 600ms TTL a lease was
	// lost beside two busy loops (load ~8) before its refresh landed.
	waitRefreshes := func(want int64) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); counter.batched.Load()+counter.single.Load() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("only %d refreshes on node 0 in 30s, want %d", counter.batched.Load()+counter.single.Load(), want)
			}
		}
	}
	waitRefreshes(3 * n)
	single, calls, batched := counter.single.Load(), counter.batch.Load(), counter.batched.Load()
	t.Logf("node 0: %d refreshes in %d batch calls, %d alone", batched, calls, single)
	if single > batched/10 || calls > batched/4 {
		t.Errorf("node 0: %d refreshes in %d batch calls and %d alone: want most in batches", batched, calls, single)
	}
	// Lock 7 taken by someone else on two nodes of three (a majority),
	// lock 8 on one node only.
	key := func(i int) string { return prefix + "{" + fmt.Sprint(i) + "}" }
	for _, r := range c.raws[:2] {
		if err := r.Set(ctx, key(7), "someone else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.raws[2].Set(ctx, key(8), "someone else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases[7].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease whose lock was taken on a majority was not lost")
	}
	if !errors.Is(leases[7].Err(), dlock.ErrLost) {
		t.Fatalf("lease 7: Err = %v, want ErrLost", leases[7].Err())
	}
	waitRefreshes(counter.batched.Load() + counter.single.Load() + 2*n)
	for i, ls := range leases {
		if i == 7 {
			continue
		}
		if ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatalf("lease %d: Release: %v", i, err)
		}
	}
	for _, r := range c.raws {
		r.Del(ctx, key(7), key(8))
	}
}
