package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/etcdexport"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// waitQueue waits until name's queue holds n keys and returns them, oldest
// first.
func waitQueue(t *testing.T, ctx context.Context, raw *clientv3.Client, prefix, name string, n int) []string {
	t.Helper()
	for {
		resp, err := raw.Get(ctx, etcd.MutexName(prefix, name)+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatalf("reading the queue: %v", err)
		}
		if len(resp.Kvs) == n {
			keys := make([]string, n)
			for i, kv := range resp.Kvs {
				keys[i] = string(kv.Key)
			}
			return keys
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the queue of %q never held %d keys (it holds %d)", name, n, len(resp.Kvs))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// leaseOf returns the etcd lease a key is bound to.
func leaseOf(t *testing.T, ctx context.Context, raw *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading %q: %v (%d keys)", key, err, len(resp.Kvs))
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

type acquired struct {
	ls  *dlock.Lease
	err error
}

func acquireAsync(ctx context.Context, l *dlock.Locker, name string, o *dlock.Options) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, o)
		c <- acquired{ls, err}
	}()
	return c
}

// A waiter whose etcd lease is revoked while it waits returns an error
// matching ErrNotAcquired (not a context error) and is not granted; the
// holder keeps its lock.
func TestWaiterLeaseRevoked(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "revoked"
	la, err := a.Acquire(ctx, name, &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, name, &dlock.Options{TTL: 3 * time.Second})
	q := waitQueue(t, ctx, raw, prefix, name, 2)
	if _, err := raw.Revoke(ctx, leaseOf(t, ctx, raw, q[1])); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("waiter granted (fence %v) after its etcd lease was revoked", r.ls)
		}
		if !errors.Is(r.err, dlock.ErrNotAcquired) || errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("waiter: got %v, want ErrNotAcquired without a context error", r.err)
		}
	case <-time.After(3 * time.Second): // it renews every TTL/3
		t.Fatal("waiter still waiting 3s after its etcd lease was revoked")
	}
	if ok, err := la.Held(ctx); !ok || err != nil {
		t.Fatalf("holder: Held = %v, %v", ok, err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter cut off from etcd for longer than its TTL loses its etcd lease;
// when the partition heals it returns an error instead of being granted,
// though the holder released meanwhile and the name is free.
func TestWaiterLeaseExpiresWhilePartitioned(t *testing.T) {
	srv, minTTL := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	b := newLocker(t, newClient(t, p.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "partitioned"
	la, err := a.Acquire(ctx, name, &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, name, &dlock.Options{TTL: minTTL})
	waitQueue(t, ctx, raw, prefix, name, 2)
	p.Blackhole()
	// The server drops the waiter's key when its etcd lease expires.
	wctx, cancel := context.WithTimeout(ctx, minTTL+etcd.ExpirySlack+5*time.Second)
	waitQueue(t, wctx, raw, prefix, name, 1)
	cancel()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("waiter returned while partitioned: %v, %v", r.ls, r.err)
	default:
	}
	p.Heal()
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatal("waiter granted after its etcd lease expired")
		}
		if !errors.Is(r.err, dlock.ErrNotAcquired) {
			t.Fatalf("waiter: got %v, want ErrNotAcquired", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still waiting 10s after the partition healed")
	}
	// The name is free.
	lb, err := b.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("TryAcquire after the failed wait: %v", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter's watch whose stream breaks and resumes at a compacted revision
// is re-established from a fresh read: the waiter keeps its place, is
// granted on the release, and a cancelled one leaves no key behind.
func TestWatchResumedAfterCompaction(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	var compacted, waiting atomic.Int32
	restore := etcdexport.SetHooks(func(string) { waiting.Add(1) }, func(wr clientv3.WatchResponse) {
		if wr.CompactRevision != 0 {
			compacted.Add(1)
		}
	})
	defer restore()
	// waitingFor waits until n waiters have had their put's reply (a reply
	// lost to the blackhole below would fail the attempt).
	waitingFor := func(n int32) {
		t.Helper()
		for waiting.Load() < n {
			if ctx.Err() != nil {
				t.Fatalf("%d of %d waiters got their put's reply", waiting.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	b := newLocker(t, newClient(t, p.Addr()), &etcd.Options{KeyPrefix: prefix})
	c := newLocker(t, newClient(t, p.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "compacted"
	la, err := a.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	gotB := acquireAsync(ctx, b, name, nil)
	waitQueue(t, ctx, raw, prefix, name, 2)
	waitingFor(1)
	cctx, cancelC := context.WithCancel(ctx)
	gotC := acquireAsync(cctx, c, name, nil)
	waitQueue(t, ctx, raw, prefix, name, 3)
	waitingFor(2)

	// Cut the waiters off, move the revision on and compact it away, then
	// let them reconnect: their watches resume at a compacted revision.
	p.Blackhole()
	for range 5 {
		if _, err := raw.Put(ctx, prefix+"filler", "x"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := raw.Delete(ctx, prefix+"filler")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	p.Heal()
	// Generous: a client whose reconnection fell between the reset and the
	// heal waits out gRPC's dial timeout and backoff first (this failed at
	// 10s in 1 of 8 runs).
	deadline := time.Now().Add(30 * time.Second)
	for compacted.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 watches reported the compaction", compacted.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case r := <-gotB:
		t.Fatalf("waiter returned before the release: %v, %v", r.ls, r.err)
	case r := <-gotC:
		t.Fatalf("waiter returned before the release: %v, %v", r.ls, r.err)
	default:
	}
	cancelC()
	if r := <-gotC; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled", r.err)
	}
	waitQueue(t, ctx, raw, prefix, name, 2)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-gotB:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not granted within 5s of the release")
	}
}

// A holder that releases between a waiter's read of its predecessor and its
// watch is not missed: the waiter is granted.
func TestReleaseBetweenReadAndWatch(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "gap"
	la, err := a.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	restore := etcdexport.SetHooks(func(string) {
		if once.CompareAndSwap(false, true) {
			if err := la.Release(context.Background()); err != nil {
				t.Errorf("Release in the gap: %v", err)
			}
		}
	}, nil)
	defer restore()
	select {
	case r := <-acquireAsync(ctx, b, name, nil):
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter missed a release made before its watch was in place")
	}
	if !once.Load() {
		t.Fatal("the hook did not run: the waiter did not wait")
	}
}

// Waiters are granted in the order they queued, with increasing fences.
func TestFIFO(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "fifo"
	holder := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	lh, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	order := make(chan int, n)
	var results []<-chan acquired
	for i := range n {
		l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
		c := make(chan acquired, 1)
		results = append(results, c)
		go func() {
			ls, err := l.Acquire(ctx, name, nil)
			if err == nil {
				order <- i
				err = ls.Release(ctx)
			}
			c <- acquired{ls, err}
		}()
		waitQueue(t, ctx, raw, prefix, name, i+2)
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last, _ := lh.Fence()
	for i := range n {
		r := <-results[i]
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if got := <-order; got != i {
			t.Fatalf("grant %d went to waiter %d", i, got)
		}
		f, _ := r.ls.Fence()
		if f <= last {
			t.Fatalf("waiter %d: fence %d not above %d", i, f, last)
		}
		last = f
	}
}

// A lock's waiter on a shared etcd lease follows the Locker's watch: it
// makes no read and no watch of its own, however far back it queued. Three
// waiters are handed the lock in turn; the last one's client sends its put
// and its release, and no other unary request.
func TestWaiterFollowsLockerWatch(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "follow"
	var n rpcCounts
	lockers := make([]*dlock.Locker, 4)
	for i := range lockers {
		c := newClient(t, srv.Addr())
		if i == 3 {
			c = countingClient(t, srv.Addr(), &n)
		}
		lockers[i] = newLocker(t, c, &etcd.Options{KeyPrefix: prefix})
	}
	ls, err := lockers[0].Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []<-chan acquired
	for i := 1; i < 4; i++ {
		got = append(got, acquireAsync(ctx, lockers[i], name, nil))
		waitQueue(t, ctx, raw, prefix, name, i+1)
	}
	ranges, txns := n.ranges.Load(), n.txns.Load()
	last, _ := ls.Fence()
	for i, c := range got {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-c
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i+1, r.err)
		}
		for _, later := range got[i+1:] {
			select {
			case r := <-later:
				t.Fatalf("a later waiter returned while waiter %d held: %v, %v", i+1, r.ls, r.err)
			default:
			}
		}
		ls = r.ls
		f, _ := ls.Fence()
		if f <= last {
			t.Fatalf("waiter %d: fence %d not above %d", i+1, f, last)
		}
		last = f
	}
	if d := n.ranges.Load() - ranges; d != 0 {
		t.Errorf("the last waiter read %d times while it waited, want 0", d)
	}
	if d := n.txns.Load() - txns; d != 0 {
		t.Errorf("the last waiter sent %d transactions while it waited, want 0", d)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A key nested under a lock's name (concurrency.Mutex on "<name>/x", which
// dlock's escaping never produces) blocks the lock as a key of the name
// does, and a waiter is granted once it goes.
func TestWaiterBehindNestedKey(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "outer"
	m := concurrency.NewMutex(newSession(t, srv.Addr()), etcd.MutexName(prefix, name)+"/x")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	got := acquireAsync(ctx, l, name, nil)
	waitQueue(t, ctx, raw, prefix, name, 2)
	select {
	case r := <-got:
		t.Fatalf("waiter returned while the nested key was there: %v, %v", r.ls, r.err)
	default:
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted within 10s of the nested key's deletion")
	}
}

// A waiter behind more keys than it follows (etcdexport.MaxFollowed) watches its
// predecessor instead, and is still granted only once every key ahead of it
// is gone, whatever their order of deletion.
func TestWaiterBehindLongQueue(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "long"
	ahead := make([]string, etcdexport.MaxFollowed+1)
	for i := range ahead {
		ahead[i] = etcd.MutexName(prefix, name) + fmt.Sprintf("/%016x", i+1)
		if _, err := raw.Put(ctx, ahead[i], ""); err != nil {
			t.Fatal(err)
		}
	}
	preds := make(chan string, 8)
	defer etcdexport.SetHooks(func(pred string) { preds <- pred }, nil)()
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	actx, cancel := context.WithCancel(ctx)
	defer cancel() // before the Locker's Close, on a failure
	got := acquireAsync(actx, l, name, nil)
	waitQueue(t, ctx, raw, prefix, name, len(ahead)+1)
	if p := <-preds; p != ahead[len(ahead)-1] {
		t.Fatalf("the waiter behind %d keys watches %q; want its predecessor %q", len(ahead), p, ahead[len(ahead)-1])
	}
	// Its predecessor first, then the rest from the oldest.
	order := append([]string{ahead[len(ahead)-1]}, ahead[:len(ahead)-1]...)
	for i, k := range order {
		select {
		case r := <-got:
			t.Fatalf("waiter returned with %d keys ahead: %v, %v", len(order)-i, r.ls, r.err)
		default:
		}
		if _, err := raw.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted within 10s of the last key's deletion")
	}
}
