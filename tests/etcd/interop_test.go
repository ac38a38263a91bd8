package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The interoperability tests use concurrency.Mutex, which is also what
// `etcdctl lock <name>` runs (a session with the default 60s TTL and
// NewMutex(session, name)); etcdctl_test.go runs the etcdctl binary itself.

// newSession returns a concurrency session on its own client, closed at
// cleanup.
func newSession(t *testing.T, addr string) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(newClient(t, addr), concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func createRevision(t *testing.T, ctx context.Context, raw *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading %q: %v", key, err)
	}
	return resp.Kvs[0].CreateRevision
}

// A dlock lease excludes concurrency.Mutex (and so `etcdctl lock`) on the
// same name: TryLock fails, Lock waits for the release; then the Mutex
// excludes dlock until it unlocks.
func TestInteropDlockThenMutex(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "shared/name"
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := concurrency.NewMutex(newSession(t, srv.Addr()), etcd.MutexName(prefix, name))
	if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while dlock holds: got %v, want ErrLocked", err)
	}
	locked := make(chan error, 1)
	go func() { locked <- m.Lock(ctx) }()
	waitQueue(t, ctx, raw, prefix, name, 2)
	select {
	case err := <-locked:
		t.Fatalf("Mutex.Lock returned while dlock holds: %v", err)
	default:
	}
	fence, _ := ls.Fence()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Mutex.Lock not granted after dlock's release")
	}
	if rev := createRevision(t, ctx, raw, m.Key()); rev <= int64(fence) {
		t.Fatalf("Mutex key revision %d not above dlock's fence %d", rev, fence)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("dlock TryAcquire while the Mutex holds: got %v, want ErrNotAcquired", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ls, err = l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("dlock TryAcquire after Mutex.Unlock: %v", err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A concurrency.Mutex holder excludes dlock; a dlock waiter queues between
// Mutex waiters in arrival order and is granted in turn, with a fence above
// the previous holder's key revision.
func TestInteropMutexThenDlock(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "queue"
	mname := etcd.MutexName(prefix, name)
	first := concurrency.NewMutex(newSession(t, srv.Addr()), mname)
	if err := first.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("dlock TryAcquire while a Mutex holds: got %v, want ErrNotAcquired", err)
	}
	got := acquireAsync(ctx, l, name, nil)
	waitQueue(t, ctx, raw, prefix, name, 2)
	last := concurrency.NewMutex(newSession(t, srv.Addr()), mname)
	locked := make(chan error, 1)
	go func() { locked <- last.Lock(ctx) }()
	waitQueue(t, ctx, raw, prefix, name, 3)

	firstRev := createRevision(t, ctx, raw, first.Key())
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var ls *dlock.Lease
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		ls = r.ls
	case <-time.After(5 * time.Second):
		t.Fatal("dlock waiter not granted after the Mutex unlocked")
	}
	if f, _ := ls.Fence(); int64(f) <= firstRev {
		t.Fatalf("fence %d not above the Mutex holder's revision %d", f, firstRev)
	}
	select {
	case err := <-locked:
		t.Fatalf("the second Mutex locked while dlock holds (err %v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second Mutex not granted after dlock's release")
	}
	if err := last.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Two leases of one Locker on one name exclude each other (concurrency.Mutex
// on one session does not: both would get the same key).
func TestSameLockerSameName(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "self"
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire on the same Locker: got %v, want ErrNotAcquired", err)
	}
	got := acquireAsync(ctx, l, name, nil)
	waitQueue(t, ctx, raw, prefix, name, 2)
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
