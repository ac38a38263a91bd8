package redis_test

import (
	"context"
	"fmt"
	"github.com/dlock/dlock/tests/internal/testutil"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// proxies is one Locker's Faults when its client talks to several servers:
// a faultnet proxy per server, each fault applied to all of them.
type proxies struct {
	mu     sync.Mutex
	byAddr map[string]*faultnet.Proxy // server address -> its proxy
}

// newProxies makes a proxy for each of addrs, closed at cleanup.
func newProxies(t testing.TB, addrs ...string) *proxies {
	t.Helper()
	p := &proxies{byAddr: map[string]*faultnet.Proxy{}}
	for _, a := range addrs {
		fp := faultnet.ListenT(t, a)
		p.byAddr[a] = fp
	}
	return p
}

// dial reaches addr through its proxy; an address without one is an error,
// so that no traffic bypasses the faults.
func (p *proxies) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	fp, ok := p.byAddr[addr]
	if !ok {
		return nil, fmt.Errorf("test dialer: no proxy for %s", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, fp.Addr())
}

func (p *proxies) each(f func(*faultnet.Proxy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fp := range p.byAddr {
		f(fp)
	}
}

func (p *proxies) Blackhole()                 { p.each((*faultnet.Proxy).Blackhole) }
func (p *proxies) Heal()                      { p.each((*faultnet.Proxy).Heal) }
func (p *proxies) Reset()                     { p.each((*faultnet.Proxy).Reset) }
func (p *proxies) SetLatency(d time.Duration) { p.each(func(fp *faultnet.Proxy) { fp.SetLatency(d) }) }

// clientHarness runs the suite on a Locker over a go-redis client other than
// a plain *goredis.Client: newClient makes one whose connections go through
// dial.
type clientHarness struct {
	addrs     []string // every server the client may dial, as it names them
	newClient func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient
	raw       goredis.UniversalClient // for Residue
}

func (h clientHarness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p := newProxies(t, h.addrs...)
	c := h.newClient(p.dial)
	t.Cleanup(func() { _ = c.Close() })
	connect(t, c)
	o := &redis.Options{}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := redis.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

func (h clientHarness) Residue(ctx context.Context, name string) ([]string, error) {
	return harness{raw: nil}.residueOn(ctx, h.raw, name)
}

// residueOn is Residue on client c.
func (harness) residueOn(ctx context.Context, c goredis.UniversalClient, name string) ([]string, error) {
	var left []string
	for _, k := range stateKeys(name) {
		n, err := c.Exists(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			left = append(left, k)
		}
	}
	return left, nil
}

// The driver on a *goredis.ClusterClient over a Redis Cluster of three
// masters passes the suite (its Chaos section for 5s, client-side faults
// only): every script's keys share one slot, and the grant and release
// messages, PUBLISHed on whichever master holds the lock, reach the
// Locker's pub/sub connection on whichever node it is.
func TestClusterClientConformance(t *testing.T) {
	cl := dlocktest.RequireRedisCluster(t)
	raw := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = raw.Close() })
	// A short Chaos section: the plain-client suite runs the long one. A
	// 1s TTL, not the suite's 500ms: a cluster client's refresh (its
	// connection per master, a slots refresh) missed a 500ms lease's
	// ValidUntil at load ~8 (busy run 30, WatchdogStopsOnRelease); the
	// subject here is the cluster, not how short a TTL can be.
	conformance.RunConfig(t, clientHarness{
		addrs: cl.Addrs(),
		newClient: func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), Dialer: dial, ContextTimeoutEnabled: true})
		},
		raw: raw,
	}, conformance.Config{Chaos: 5 * time.Second, TTL: time.Second})
}

// Locks whose names hash to each of the three masters are granted and
// handed over through the cluster: a waiter whose Locker's pub/sub
// connection is on one node gets the lock released on another node at once
// (by its grant message), not at its poll interval.
func TestClusterClientHandoffAcrossNodes(t *testing.T) {
	cl := dlocktest.RequireRedisCluster(t)
	ctx := testutil.Ctx(t)
	newCluster := func() *goredis.ClusterClient {
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	raw := newCluster()
	holder := newLocker(t, newCluster(), nil)
	waiter := newLocker(t, newCluster(), nil)

	// One name per master: {name} hashes to the node serving its slot.
	names := map[string]string{} // node address -> name
	for i := 0; len(names) < len(cl.Nodes); i++ {
		name := fmt.Sprintf("%s-%d", t.Name(), i)
		slot, err := raw.ClusterKeySlot(ctx, redis.DefaultKeyPrefix+"{"+name+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		addr := cl.Nodes[int(slot)*len(cl.Nodes)/16384].Addr()
		if _, ok := names[addr]; !ok {
			names[addr] = name
		}
	}
	for addr, name := range names {
		lease, err := holder.Acquire(ctx, name, &dlock.Options{TTL: time.Minute})
		if err != nil {
			t.Fatalf("%s on %s: %v", name, addr, err)
		}
		got := make(chan error, 1)
		var second *dlock.Lease
		go func() {
			var err error
			// Without the grant message the waiter would find the lock only
			// at its entry's renewal (20s for this TTL).
			second, err = waiter.Acquire(ctx, name, &dlock.Options{TTL: time.Minute})
			got <- err
		}()
		waitQueuedOn(t, raw, name)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s on %s: waiter: %v", name, addr, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s on %s: the waiter was not granted the lock within 5s of its release", name, addr)
		}
		f1, _ := lease.Fence()
		f2, _ := second.Fence()
		if f2 <= f1 {
			t.Errorf("%s: fences %d then %d, want increasing", name, f1, f2)
		}
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueuedOn waits until a waiter is queued on name.
func waitQueuedOn(t *testing.T, c goredis.UniversalClient, name string) {
	t.Helper()
	q := redis.DefaultKeyPrefix + "{" + name + "}:queue"
	deadline := time.Now().Add(10 * time.Second)
	for c.ZCard(t.Context(), q).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no waiter queued on %s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The driver on a *goredis.FailoverClient (Sentinel) passes the suite (its
// Chaos section for 5s, client-side faults only).
func TestFailoverClientConformance(t *testing.T) {
	rs := dlocktest.RequireRedisSentinel(t)
	raw := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: dlocktest.MasterName, SentinelAddrs: []string{rs.Sentinel.Addr()},
		Dialer: rs.Dial, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = raw.Close() })
	addrs := []string{rs.Sentinel.Addr(), rs.Master.Addr(), rs.Replica.Addr()}
	conformance.RunConfig(t, clientHarness{
		addrs: addrs,
		newClient: func(dial func(context.Context, string, string) (net.Conn, error)) goredis.UniversalClient {
			return goredis.NewFailoverClient(&goredis.FailoverOptions{
				MasterName: dlocktest.MasterName, SentinelAddrs: []string{rs.Sentinel.Addr()},
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return dial(ctx, network, rs.PublishedAddr(addr))
				},
				ContextTimeoutEnabled: true,
			})
		},
		raw: raw,
	}, conformance.Config{Chaos: 5 * time.Second})
}

// Through a Sentinel failover (SENTINEL FAILOVER: the replica is promoted,
// the old master demoted), a FailoverClient's Locker keeps working: a lock
// taken before it (and replicated, WAIT) is released after it on the new
// master, a waiter queued before it is granted the lock at once on that
// release (the grant reaches its pub/sub connection, moved or not), and
// the fence keeps increasing.
func TestFailoverClientFailover(t *testing.T) {
	rs := dlocktest.RequireRedisSentinel(t)
	ctx := testutil.Ctx(t)
	newFailover := func() *goredis.Client {
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName: dlocktest.MasterName, SentinelAddrs: []string{rs.Sentinel.Addr()},
			Dialer: rs.Dial, ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	raw := newFailover()
	holder := newLocker(t, newFailover(), nil)
	waiter := newLocker(t, newFailover(), nil)
	name := t.Name()
	opts := &dlock.Options{TTL: 30 * time.Second}

	lease, err := holder.Acquire(ctx, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var second *dlock.Lease
	go func() {
		var err error
		second, err = waiter.Acquire(ctx, name, opts)
		got <- err
	}()
	waitQueuedOn(t, raw, name)
	if n, err := raw.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %v replicas, %v", n, err)
	}

	sentinel := goredis.NewSentinelClient(&goredis.Options{Addr: rs.Sentinel.Addr(), ContextTimeoutEnabled: true})
	defer sentinel.Close()
	if err := sentinel.Failover(ctx, dlocktest.MasterName).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		addr, err := sentinel.GetMasterAddrByName(ctx, dlocktest.MasterName).Result()
		if err == nil && rs.PublishedAddr(net.JoinHostPort(addr[0], addr[1])) == rs.Replica.Addr() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel did not promote the replica within 20s (master %v, %v)", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The client learns of the switch from the sentinel; wait until its
	// writes reach the new master.
	for raw.Set(ctx, name+"-probe", 1, time.Second).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the failover client did not reach the new master")
		}
		time.Sleep(50 * time.Millisecond)
	}

	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after the failover: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(5 * time.Second):
		// Its entry's renewal (every 10s for this TTL) would find it later.
		t.Fatal("the waiter was not granted the lock within 5s of the release after the failover")
	}
	t.Logf("waiter granted %v after the release", time.Since(released))
	f1, _ := lease.Fence()
	f2, _ := second.Fence()
	if f2 <= f1 {
		t.Errorf("fences %d then %d, want increasing", f1, f2)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
