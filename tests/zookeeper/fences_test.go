package zookeeper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/tests/internal/testutil"
)

// TestSameNameFencesIncrease: acquisitions of one name by one Locker, at
// once, are granted in turn with strictly increasing fences. Their creates
// come together, and the Locker groups concurrent creates into one
// multi-op, whose nodes share its zxid (their czxid, the fence): two of one
// name in one multi-op gave two holders, one after the other, one fence.
func TestSameNameFencesIncrease(t *testing.T) {
	srv := zkServer(t)
	l := connect(t, srv.Addr(), withTTL(20*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "fences-" + testutil.RandomHex(4)
	// The name's node first, so that the creates below all go to it.
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var mu sync.Mutex
	var fences []uint64
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ls, err := l.Acquire(ctx, name, nil)
			if err != nil {
				errs <- err
				return
			}
			f, _ := ls.Fence()
			mu.Lock()
			fences = append(fences, f) // in grant order: the lock is held
			mu.Unlock()
			errs <- ls.Release(ctx)
		})
	}
	// Released once every waiter has queued behind it.
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	waitFor(t, 30*time.Second, "every waiter queued", func() bool {
		nodes, err := lockNodes(raw, name)
		return err == nil && len(nodes) == n+1
	})
	release(t, ls)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("fences in grant order %v: the %dth is not above the one before", fences, i)
			break
		}
	}
}
