package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// quiet drops go-redis's log lines: the fault tests make it log every
// failed dial to a killed node.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	goredis.SetLogger(quiet{})
	dlocktest.Main(m)
}

// cluster is a set of independent Redis servers started for one test, each
// in its own container, closed at the test's cleanup.
type cluster struct {
	srvs []*dlocktest.Server
	raws []*goredis.Client // straight to each server, for inspection
}

// newCluster starts n Redis servers at once. Without Docker it skips, or
// fails with DLOCK_REQUIRE_BACKENDS=1, as dlocktest.RequireNew does.
func newCluster(t testing.TB, n int, opts *dlocktest.StartOptions) *cluster {
	t.Helper()
	if os.Getenv("DLOCK_REDIS_ADDR") != "" {
		t.Skip("redlock tests need servers of their own, but DLOCK_REDIS_ADDR names an external one")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := &cluster{srvs: make([]*dlocktest.Server, n), raws: make([]*goredis.Client, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.srvs[i], errs[i] = dlocktest.Start(ctx, dlocktest.Redis, opts)
		}()
	}
	wg.Wait()
	for _, s := range c.srvs {
		if s != nil {
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Error(err)
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		if errors.Is(err, dlocktest.ErrNoDocker) {
			if v, _ := strconv.ParseBool(os.Getenv(dlocktest.RequireBackendsEnv)); !v {
				t.Skipf("no Redis servers: %v", err)
			}
		}
		t.Fatalf("starting %d Redis servers: %v", n, err)
	}
	for i, s := range c.srvs {
		c.raws[i] = newClient(t, s.Addr())
	}
	return c
}

func (c *cluster) addrs() []string {
	a := make([]string, len(c.srvs))
	for i, s := range c.srvs {
		a[i] = s.Addr()
	}
	return a
}

// clients returns a new go-redis client per server, closed at cleanup.
func (c *cluster) clients(t testing.TB) []goredis.UniversalClient {
	t.Helper()
	cs := make([]goredis.UniversalClient, len(c.srvs))
	for i, s := range c.srvs {
		cs[i] = newClient(t, s.Addr())
	}
	return cs
}

// proxied returns a new go-redis client per server, each through a faultnet
// proxy of its own, closed at cleanup.
//
// Each client has a connection open when it is returned, as an
// application's long-lived client has: a fresh client's first request dials
// through the proxy and Docker's port forwarding and does the RESP
// handshake, 30-110ms at load ~30 on 2 cores (3-20ms once connected), and
// fifteen of them at once (a new locker's first request on three lockers)
// ran past a 250ms node timeout on every node. A client that cannot
// connect fails the test as the harness's fault, not the driver's.
func (c *cluster) proxied(t testing.TB) ([]goredis.UniversalClient, proxies) {
	t.Helper()
	cs := make([]goredis.UniversalClient, len(c.srvs))
	ps := make(proxies, len(c.srvs))
	for i, s := range c.srvs {
		p := faultnet.ListenT(t, s.Addr())
		ps[i] = p
		cs[i] = newClient(t, p.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, cl := range cs {
		wg.Go(func() {
			if err := cl.Ping(ctx).Err(); err != nil {
				errs[i] = fmt.Errorf("harness: connecting a client to node %d through its proxy: %w", i, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return cs, ps
}

// holders counts the servers on which key holds value.
func (c *cluster) holders(t testing.TB, key, value string) int {
	t.Helper()
	n := 0
	for i, r := range c.raws {
		v, err := r.Get(context.Background(), key).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatalf("GET %s on node %d: %v", key, i, err)
		}
		if err == nil && v == value {
			n++
		}
	}
	return n
}

// present lists the nodes on which key exists.
func (c *cluster) present(t testing.TB, key string) []int {
	t.Helper()
	var on []int
	for i, r := range c.raws {
		n, err := r.Exists(context.Background(), key).Result()
		if err != nil {
			t.Fatalf("EXISTS %s on node %d: %v", key, i, err)
		}
		if n > 0 {
			on = append(on, i)
		}
	}
	return on
}

// proxies is every node's proxy on one locker's path: a fault on it is a
// fault on that locker's whole network.
type proxies []*faultnet.Proxy

func (ps proxies) Blackhole() {
	for _, p := range ps {
		p.Blackhole()
	}
}

func (ps proxies) Heal() {
	for _, p := range ps {
		p.Heal()
	}
}

func (ps proxies) Reset() {
	for _, p := range ps {
		p.Reset()
	}
}

func (ps proxies) SetLatency(d time.Duration) {
	for _, p := range ps {
		p.SetLatency(d)
	}
}

// newClient returns a go-redis client on addr, closed at cleanup.
func newClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newLocker returns a Locker on clients, closed at cleanup.
func newLocker(t testing.TB, clients []goredis.UniversalClient, opts *redlock.Options) *dlock.Locker {
	t.Helper()
	l, err := redlock.New(clients, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}
