package redlock_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/tests/internal/testutil"
	goredis "github.com/redis/go-redis/v9"
)

// A waiter whose watch failed on a minority node (its pub/sub connection
// could not be made there) watches that node again once it can: it ends up
// subscribed and queued on every node, as a waiter that never met the
// fault, instead of staying deaf to that node for the rest of its wait.
func TestWatchRetriedOnNode(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	holder := newLocker(t, c.clients(t), nil)
	// Node 2's client refuses new connections while down: the connection
	// it already has (made by the ping below) still serves the attempts,
	// so the waiter queues its ticket there, but the pub/sub connection
	// its watch needs cannot be made.
	var down atomic.Bool
	var failed atomic.Int64
	var dialer net.Dialer
	clients := c.clients(t)
	faulty := goredis.NewClient(&goredis.Options{
		Addr: c.srvs[2].Addr(), ContextTimeoutEnabled: true, DialerRetries: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				failed.Add(1)
				return nil, errors.New("test: node 2 refuses new connections")
			}
			return dialer.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = faulty.Close() })
	if err := faulty.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clients[2] = faulty
	waiter := newLocker(t, clients, nil)
	name := "rewatch-" + testutil.RandomHex(4)
	ls := holdEverywhere(ctx, t, c, holder, name) // a node where it is free queues nobody
	down.Store(true)
	type result struct {
		ls  *dlock.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, name, nil)
		done <- result{l, err}
	}()
	eventually(t, live(t, 5*time.Second), "the waiter subscribed and queued on nodes 0 and 1", func() bool {
		return queued(ctx, c.raws[0], name) && queued(ctx, c.raws[1], name)
	})
	// The watch on node 2 started with the others, and its pub/sub
	// connection's dial is the only one the client makes (its pool has a
	// connection): once that dial was refused, the watch there has failed
	// (go-redis does not dial again on a refusal; the hub ends the epoch
	// at once). Without watching again, nothing dials after it.
	eventually(t, live(t, 5*time.Second), "a dial refused on node 2", func() bool { return failed.Load() >= 1 })
	if queued(ctx, c.raws[2], name) {
		t.Fatal("subscribed on node 2 while it refused connections")
	}
	down.Store(false)
	if !within(live(t, 5*time.Second), func() bool { return queued(ctx, c.raws[2], name) }) {
		t.Fatalf("the waiter subscribed and queued on node 2 once it took connections: not within %v: %s", live(t, 5*time.Second), queueState(ctx, c, name))
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
