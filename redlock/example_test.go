package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// Open a Locker over five independent Redis masters: a lock is granted by a
// majority, so two nodes down or paused change nothing.
func Example() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	ls, err := l.Acquire(ctx, "nightly-report", nil)
	if errors.Is(err, redlock.ErrNoQuorum) {
		log.Fatal("a majority of the nodes cannot be reached")
	}
	if err != nil {
		log.Fatal(err)
	}
	defer ls.Release(ctx)
	fence, _ := ls.Fence()
	fmt.Println("holding with fencing token", fence)
}

// Build a Locker on the application's clients, one per master: any slice of
// go-redis clients works as it is.
func ExampleNew() {
	var clients []*goredis.Client
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1})
		defer c.Close()
		clients = append(clients, c)
	}
	l, err := redlock.New(clients, &redlock.Options{Defaults: dlock.Options{TTL: 10 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
}
