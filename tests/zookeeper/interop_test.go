package zookeeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// lockAsync runs zk.Lock.Lock in the background. It returns when the lock is
// taken, or with an error when the connection closes.
func lockAsync(zl *zk.Lock) <-chan error {
	c := make(chan error, 1)
	go func() { c <- zl.Lock() }()
	return c
}

// TestInteropZkLock: go-zookeeper's zk.Lock and dlock on LockPath(root,
// name) exclude each other and queue together, in both directions.
func TestInteropZkLock(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	raw2 := rawConn(t, srv.Addr(), 10*time.Second)
	l := connect(t, srv.Addr(), withTTL(5*time.Second))
	name := "interop/zk.Lock " + randomHex(4) // escaped: one path component
	path := zookeeper.LockPath("", name)
	acl := zk.WorldACL(zk.PermAll)
	t.Cleanup(func() { _ = raw.Delete(path, -1) }) // zk.Lock may make it persistent

	// zk.Lock holds: dlock's TryAcquire fails and its Acquire waits.
	zl := zk.NewLock(raw, path, acl)
	if err := zl.Lock(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while zk.Lock holds: got %v, want ErrNotAcquired", err)
	}
	waitQueue(t, raw, name, 1) // the failed attempt left no node
	c := acquireAsync(ctx, l, name)
	waitQueue(t, raw, name, 2)
	notGranted(t, c, "dlock behind zk.Lock")
	if err := zl.Unlock(); err != nil {
		t.Fatal(err)
	}
	ls := granted(t, c, 5*time.Second, "dlock after zk.Unlock")

	// dlock holds: zk.Lock waits, and is granted on release.
	zl2 := zk.NewLock(raw2, path, acl)
	zc := lockAsync(zl2)
	waitQueue(t, raw, name, 2)
	select {
	case err := <-zc:
		t.Fatalf("zk.Lock returned (%v) while dlock holds the lock", err)
	case <-time.After(200 * time.Millisecond):
	}
	release(t, ls)
	select {
	case err := <-zc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("zk.Lock not granted within 5s of dlock's release")
	}

	// A mixed queue is served in arrival order: zk.Lock (holding), dlock A,
	// zk.Lock, dlock B.
	la := connect(t, srv.Addr(), withTTL(5*time.Second))
	lb := connect(t, srv.Addr(), withTTL(5*time.Second))
	ca := acquireAsync(ctx, la, name)
	waitQueue(t, raw, name, 2)
	zl3 := zk.NewLock(raw, path, acl)
	zc3 := lockAsync(zl3)
	waitQueue(t, raw, name, 3)
	cb := acquireAsync(ctx, lb, name)
	waitQueue(t, raw, name, 4)

	if err := zl2.Unlock(); err != nil {
		t.Fatal(err)
	}
	lsa := granted(t, ca, 5*time.Second, "dlock A")
	notGranted(t, cb, "dlock B")
	release(t, lsa)
	select {
	case err := <-zc3:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second zk.Lock not granted after dlock A")
	}
	notGranted(t, cb, "dlock B")
	if err := zl3.Unlock(); err != nil {
		t.Fatal(err)
	}
	release(t, granted(t, cb, 5*time.Second, "dlock B"))
}

// TestInteropCurator: a node in Curator's InterProcessMutex layout
// (_c_<UUID>-lock-<seq>) holds the lock against dlock.
func TestInteropCurator(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	l := connect(t, srv.Addr(), withTTL(5*time.Second))
	name := "curator-" + randomHex(4)
	path := zookeeper.LockPath("", name)
	if _, err := raw.Create(path, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	curator, err := raw.Create(path+"/_c_2f8e3b7a-0c1d-4e5f-9a8b-7c6d5e4f3a2b-lock-", []byte("10.0.0.7"),
		zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while a Curator node holds: got %v, want ErrNotAcquired", err)
	}
	c := acquireAsync(ctx, l, name)
	waitQueue(t, raw, name, 2)
	notGranted(t, c, "dlock behind Curator")
	if err := raw.Delete(curator, -1); err != nil {
		t.Fatal(err)
	}
	release(t, granted(t, c, 5*time.Second, "dlock after Curator's release"))
}
