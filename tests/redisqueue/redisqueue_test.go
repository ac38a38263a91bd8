package redisqueue_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	goredis "github.com/redis/go-redis/v9"
)

// The helpers below are tests/redis's (redis_test.go,
// servers_clients_test.go), for the queue's tests.

func TestMain(m *testing.M) { dlocktest.Main(m) }

func redisAddr(t testing.TB) string {
	t.Helper()
	return dlocktest.Require(t, dlocktest.Redis).Addr()
}

// newClient returns a go-redis client on addr, closed at cleanup.
func newClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// proxies is one client's Faults when it talks to several servers: a
// faultnet proxy per server, each fault applied to all of them.
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
