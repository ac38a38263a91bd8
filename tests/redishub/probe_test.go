package redishub_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

// When a client's commands move to another server while the hub's pub/sub
// connection stays subscribed on the first (a go-redis failover client
// after a Sentinel failover: its command pool follows the new master, its
// pub/sub connection does not), a hub with a probe channel moves its
// connection to where the commands go, and wakes its waiters, instead of
// listening where nothing will be published.
func TestProbeFollowsCommands(t *testing.T) {
	first := dlocktest.RequireNew(t, dlocktest.Redis).Addr() // its clients are killed
	second := dlocktest.Require(t, dlocktest.Redis).Addr()
	var target atomic.Value // the server the client dials
	target.Store(first)
	c := goredis.NewClient(&goredis.Options{
		Addr: "moving", ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, target.Load().(string))
		},
	})
	h := &hub{redishub.New(c, "redis", routeGrant)}
	h.SetLinger(0)
	suffix := time.Now().Format("150405.000000")
	h.SetProbe("dlocktest:probe:" + suffix)
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("hub close: %v", err)
		}
		_ = c.Close()
	})
	rawFirst := goredis.NewClient(&goredis.Options{Addr: first})
	defer rawFirst.Close()
	rawSecond := goredis.NewClient(&goredis.Options{Addr: second})
	defer rawSecond.Close()

	ctx := context.Background()
	channel := "dlocktest:hub:" + suffix
	woken, stop, err := h.watch(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if n := numSub(t, rawFirst, channel); n != 1 {
		t.Fatalf("%d subscriptions on the first server, want 1", n)
	}
	// Healthy: the probe passes and nobody is woken.
	select {
	case <-woken:
		t.Fatal("woken while the commands and the subscription share a server")
	case <-time.After(2500 * time.Millisecond):
	}

	// The commands move: the client's command connections to the first
	// server are killed (as Sentinel's demotion does, later, to the old
	// master's) and it dials the second from now on. The pub/sub
	// connection is not a normal client and stays.
	target.Store(second)
	if err := rawFirst.ClientKillByFilter(ctx, "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	moved := time.Now()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken 10s after the commands moved to another server")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !h.Ready(channel) || numSub(t, rawSecond, channel) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not subscribed on the second server 10s after the commands moved (%d there)", numSub(t, rawSecond, channel))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("subscribed where the commands go %v after they moved", time.Since(moved))
	select { // the wakes of the reconnection
	case <-woken:
	default:
	}
	if err := rawSecond.Publish(ctx, channel, "released").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("a message published where the commands go did not reach the waiter")
	}
}
