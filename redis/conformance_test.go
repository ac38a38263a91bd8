package redis_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// harness gives every locker its own go-redis client dialling the shared
// server through its own faultnet proxy.
type harness struct {
	addr   string
	raw    *goredis.Client // straight to the server, for Residue
	compat bool
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	o := &redis.Options{Compat: h.compat}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := redis.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue reports the lock key and, in the default layout, the queue and
// the waiter entries (the fence counter persists by design).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	lock := redis.DefaultKeyPrefix + "{" + name + "}"
	keys := []string{lock, lock + ":queue", lock + ":waiters"}
	if h.compat {
		keys = []string{name}
	}
	var left []string
	for _, k := range keys {
		n, err := h.raw.Exists(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			left = append(left, k)
		}
	}
	return left, nil
}

func newHarness(t *testing.T, compat bool) harness {
	srv := servers.Require(t, servers.Redis)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = raw.Close() })
	return harness{addr: srv.Addr(), raw: raw, compat: compat}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t, false))
}

func TestConformanceCompat(t *testing.T) {
	conformance.Run(t, newHarness(t, true))
}
