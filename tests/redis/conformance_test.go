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
	"github.com/dlock/dlock/dlocktest"
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
	p := faultnet.ListenT(t, h.addr)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	connect(t, c)
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
	srv *dlocktest.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// runConformance runs the suite on a server of its own, so that the Chaos
// section can pause and restart it; on an external server (DLOCK_REDIS_ADDR)
// it runs without server faults.
func runConformance(t *testing.T, compat bool, cfg conformance.Config) {
	external := os.Getenv("DLOCK_REDIS_ADDR") != ""
	var srv *dlocktest.Server
	if external {
		srv = dlocktest.Require(t, dlocktest.Redis)
	} else {
		srv = dlocktest.RequireNew(t, dlocktest.Redis)
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

// connect opens c's first connection before the suite uses it, as an
// application's long-lived client has one: a fresh client's first request
// dials through the proxy and Docker's port forwarding and does the RESP
// handshake, which beside two busy loops took most of the suite's 500ms TTL
// (a reader's grant came back 775ms after its request, expired). A client
// that cannot connect fails the test as the harness's fault.
func connect(t testing.TB, c goredis.UniversalClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("harness: connecting a client through its proxy: %v", err)
	}
}
