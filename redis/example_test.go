package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9" // named goredis: this package is redis too
)

// Open a Locker from a URL and hold a lock while working. The lease's
// context ends if the lock is lost.
func Example() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	ls, err := l.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ls.Release(ctx)
	fence, _ := ls.Fence() // pass it to the storage you protect
	fmt.Println("holding with fencing token", fence)
	doWork(ls.Context(), fence)
}

// Build a Locker on the application's go-redis client. ContextTimeoutEnabled
// lets a ctx deadline cut a call to an unresponsive server short.
func ExampleNew() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	l, err := redis.New(client, &redis.Options{Defaults: dlock.Options{TTL: 10 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
}

// Migrate from redsync or bsm/redislock without a flag day: in the compat
// layout dlock's lock key is theirs, so old and new processes exclude each
// other (no fencing tokens in that layout).
func ExampleOptions_compat() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?compat=true")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)
}

func doWork(ctx context.Context, fence uint64) {}
