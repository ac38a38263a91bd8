package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// quiet drops go-redis's log lines: the fault tests make it log every
// failed dial to a killed node.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	goredis.SetLogger(quiet{})
	servertest.Main(m)
}

// cluster is a set of independent Redis servers started for one test, each
// in its own container, closed at the test's cleanup.
type cluster struct {
	srvs []*servers.Server
	raws []*goredis.Client // straight to each server, for inspection
}

// newCluster starts n Redis servers at once. Without Docker it skips, or
// fails with DLOCK_REQUIRE_BACKENDS=1, as servers.RequireNew does.
func newCluster(t testing.TB, n int, opts *servers.StartOptions) *cluster {
	t.Helper()
	if os.Getenv("DLOCK_REDIS_ADDR") != "" {
		t.Skip("redlock tests need servers of their own, but DLOCK_REDIS_ADDR names an external one")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := &cluster{srvs: make([]*servers.Server, n), raws: make([]*goredis.Client, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.srvs[i], errs[i] = servers.Start(ctx, servers.Redis, opts)
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
		if errors.Is(err, servers.ErrNoDocker) {
			if v, _ := strconv.ParseBool(os.Getenv(servers.RequireBackendsEnv)); !v {
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
func (c *cluster) proxied(t testing.TB) ([]goredis.UniversalClient, proxies) {
	t.Helper()
	cs := make([]goredis.UniversalClient, len(c.srvs))
	ps := make(proxies, len(c.srvs))
	for i, s := range c.srvs {
		p, err := faultnet.Listen(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
		cs[i] = newClient(t, p.Addr())
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

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
