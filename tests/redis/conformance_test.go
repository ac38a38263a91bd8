package redis_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

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
// the waiter entries with their tokens (the fence counter persists by
// design): a waiter's entry outliving its wait is orphaned waiter state.
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	if h.compat {
		n, err := h.raw.Exists(ctx, name).Result()
		if err != nil || n == 0 {
			return nil, err
		}
		return []string{name}, nil
	}
	lock := redis.DefaultKeyPrefix + "{" + name + "}"
	var left []string
	n, err := h.raw.Exists(ctx, lock).Result()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		left = append(left, lock)
	}
	queued, err := h.raw.ZRange(ctx, lock+":queue", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	if len(queued) > 0 {
		left = append(left, fmt.Sprintf("%s:queue %q", lock, queued))
	}
	waiters, err := h.raw.HKeys(ctx, lock+":waiters").Result()
	if err != nil {
		return nil, err
	}
	if len(waiters) > 0 {
		left = append(left, fmt.Sprintf("%s:waiters %q", lock, waiters))
	}
	// The other kinds' keys (their counters persist by design).
	for _, k := range stateKeys(name)[3:] {
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

// stateKeys are the default layout's keys of name that hold state of a
// lease or a wait, and so must be gone once every lease and wait ended:
// the lock's (lock, queue, waiters), then the semaphore's (holders, limit)
// and the read/write lock's (readers, writer, writers' waits); not the
// fencing counters, which persist by design.
func stateKeys(name string) []string {
	b := redis.DefaultKeyPrefix + "{" + name + "}"
	return []string{b, b + ":queue", b + ":waiters",
		b + ":permits", b + ":permits:limit",
		b + ":rw:readers", b + ":rw:writer", b + ":rw:waits", b + ":meta"}
}

// ownServer is a harness on a server of the test's own, which the suite's
// Chaos section may pause and restart (without persistence, as the test
// servers run).
type ownServer struct {
	harness
	srv *servers.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// runConformance runs the suite on a server of its own, so that the Chaos
// section can pause and restart it; on an external server (DLOCK_REDIS_ADDR)
// it runs without server faults.
func runConformance(t *testing.T, compat bool, cfg conformance.Config) {
	external := os.Getenv("DLOCK_REDIS_ADDR") != ""
	var srv *servers.Server
	if external {
		srv = servers.Require(t, servers.Redis)
	} else {
		srv = servers.RequireNew(t, servers.Redis)
	}
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = raw.Close() })
	h := harness{addr: srv.Addr(), raw: raw, compat: compat}
	if external {
		conformance.RunConfig(t, h, cfg)
		return
	}
	conformance.RunConfig(t, ownServer{h, srv}, cfg)
}

func TestConformance(t *testing.T) { runConformance(t, false, conformance.Config{}) }

func TestConformanceCompat(t *testing.T) {
	runConformance(t, true, conformance.Config{Chaos: 10 * time.Second})
}
