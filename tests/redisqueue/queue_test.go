package redisqueue_test

import (
	"context"
	"net"
	"testing"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	qconf "github.com/dlock/dlock/queue/conformance"
	"github.com/dlock/dlock/queue/redisqueue"
	goredis "github.com/redis/go-redis/v9"
)

// queueHarness gives each client of the task-queue suite its own
// connections through fault proxies.
type queueHarness struct {
	addrs     []string
	newClient func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient
	raw       goredis.UniversalClient
}

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	t.Helper()
	p := newProxies(t, h.addrs...)
	c := h.newClient(p.dial)
	t.Cleanup(func() { _ = c.Close() })
	qc, err := redisqueue.NewQueue(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return qc, p
}

func (h queueHarness) Residue(ctx context.Context, name string) ([]string, error) {
	var left []string
	k := redisqueue.DefaultQueuePrefix + "{" + name + "}:"
	for _, s := range []string{"due", "claimed", "dead", "payload", "info"} {
		n, err := h.raw.Exists(ctx, k+s).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			left = append(left, k+s)
		}
	}
	return left, nil
}

// The task queue on one Redis server passes the suite.
func TestQueueConformance(t *testing.T) {
	addr := redisAddr(t)
	qconf.Run(t, queueHarness{
		addrs: []string{addr},
		newClient: func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient {
			return goredis.NewClient(&goredis.Options{Addr: addr, Dialer: dial, ContextTimeoutEnabled: true})
		},
		raw: newClient(t, addr),
	})
}

// The task queue on a Redis Cluster passes the suite: each queue's keys
// share one slot, and its wake-ups reach the waiters' pub/sub connections
// wherever they are.
func TestQueueClusterConformance(t *testing.T) {
	cl := dlocktest.RequireRedisCluster(t)
	raw := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = raw.Close() })
	qconf.Run(t, queueHarness{
		addrs: cl.Addrs(),
		newClient: func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), Dialer: dial, ContextTimeoutEnabled: true})
		},
		raw: raw,
	})
}
