package etcd_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Acquisitions and releases by many goroutines at once go grouped, far
// fewer requests than locks, each with its own outcome: every lease's fence
// is its key's create revision, and tries on a few names from many
// goroutines never grant one name twice at once.
func TestGroupedTxns(t *testing.T) {
	srv, _ := etcdServer(t)
	var n rpcCounts
	c := countingClient(t, srv.Addr(), &n)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, c, &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	const count, workers = 400, 16
	run := func(f func(i int)) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < count; i = int(next.Add(1) - 1) {
					f(i)
				}
			})
		}
		wg.Wait()
	}
	leases := make([]*dlock.Lease, count)
	t0 := n.txns.Load()
	run(func(i int) {
		ls, err := l.Acquire(ctx, fmt.Sprintf("g%d", i), &dlock.Options{TTL: 3 * time.Second})
		if err != nil {
			t.Error(err)
			return
		}
		leases[i] = ls
	})
	if t.Failed() {
		t.FailNow()
	}
	acq := n.txns.Load() - t0
	for i, ls := range leases {
		if f, _ := ls.Fence(); int64(f) != createRevision(t, ctx, raw, fmt.Sprintf("%sg%d/%s", prefix, i, ls.Token())) {
			t.Fatalf("lease %d: fence %d is not its key's create revision", i, f)
		}
	}
	t0 = n.txns.Load()
	run(func(i int) {
		if err := leases[i].Release(ctx); err != nil {
			t.Error(err)
		}
	})
	rel := n.txns.Load() - t0
	t.Logf("%d locks by %d goroutines: acquired in %d requests, released in %d", count, workers, acq, rel)
	if acq > count/2 || rel > count/2 {
		t.Errorf("%d locks: acquired in %d requests, released in %d; want them grouped", count, acq, rel)
	}
	if resp, err := raw.Get(ctx, prefix+"g", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("keys left after the releases: %v %v", resp, err)
	}

	// Many goroutines trying a few names: one holder per name at a time.
	var held [2]atomic.Int64
	var granted atomic.Int64
	run(func(i int) {
		name := i % 2
		ls, err := l.TryAcquire(ctx, fmt.Sprintf("few%d", name), &dlock.Options{TTL: 3 * time.Second})
		if errors.Is(err, dlock.ErrNotAcquired) {
			return
		}
		if err != nil {
			t.Error(err)
			return
		}
		granted.Add(1)
		if h := held[name].Add(1); h != 1 {
			t.Errorf("%d holders of few%d at once", h, name)
		}
		time.Sleep(time.Millisecond)
		held[name].Add(-1)
		if err := ls.Release(ctx); err != nil {
			t.Error(err)
		}
	})
	if granted.Load() == 0 {
		t.Fatal("no try was granted")
	}
}
