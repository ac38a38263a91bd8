package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// Open a Locker from a URL and hold a lock while working. The lease's
// context ends if the lock is lost (its session expired, say).
func Example() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "zk://127.0.0.1:2181,127.0.0.2:2181/myapp/locks?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	ls, err := l.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ls.Release(ctx)
	fence, _ := ls.Fence() // the lock node's czxid
	fmt.Println("holding with fencing token", fence)
	doWork(ls.Context(), fence)
}

// Share a lock with go-zookeeper's zk.Lock (or Curator's InterProcessMutex)
// on the path LockPath gives, from the application's own connection.
func ExampleNew() {
	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l, err := zookeeper.New(conn, &zookeeper.Options{SessionTimeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// Excludes dlock leases on "billing" from any Locker with the default root.
	legacy := zk.NewLock(conn, zookeeper.LockPath("", "billing"), zk.WorldACL(zk.PermAll))
	if err := legacy.Lock(); err != nil {
		log.Fatal(err)
	}
	defer legacy.Unlock()
}

func doWork(context.Context, uint64) {}

// Share a read/write lock with Apache Curator's InterProcessReadWriteLock:
// give Curator the path RWLockPath returns. Writers carry fencing tokens
// (their write node's czxid); a waiting writer keeps new readers out.
func ExampleRWLockPath() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "zk://127.0.0.1:2181?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	// new InterProcessReadWriteLock(client, path) in the Java services.
	fmt.Println(zookeeper.RWLockPath("", "catalog"))

	rw, err := l.RWLock("catalog")
	if err != nil {
		log.Fatal(err)
	}
	w, err := rw.Lock(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	fence, _ := w.Fence()
	doWork(w.Context(), fence)
}
