package dlocktest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// harness runs the conformance suite on the redis driver. Embedding
// *dlocktest.Server gives it conformance.ServerFaults (PauseServer,
// ResumeServer, RestartServer), so the suite's Chaos section pauses and
// restarts the server too. A third-party driver's harness has the same
// shape: its own client in NewLocker, its own storage in Residue.
type harness struct{ *dlocktest.Server }

// NewLocker gives each locker its own client, dialling the server through
// its own faultnet proxy.
func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	p := faultnet.ListenT(t, h.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
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

// Residue lists the keys of name that hold a lease or a wait (the fencing
// counter stays by design).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	c := goredis.NewClient(&goredis.Options{Addr: h.Addr()})
	defer c.Close()
	b := redis.DefaultKeyPrefix + "{" + name + "}"
	var left []string
	for _, k := range []string{b, b + ":queue", b + ":waiters", b + ":permits", b + ":permits:limit",
		b + ":rw:readers", b + ":rw:writer", b + ":rw:waits", b + ":meta"} {
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

// TestConformance is what a driver's test file holds: a server of the
// test's own and the suite with server faults. A driver calls
// conformance.Run(t, harness{srv}); this package runs the Chaos section
// alone, the part that uses the server faults, since the redis driver's own
// tests run the rest.
func TestConformance(t *testing.T) {
	srv := dlocktest.RequireNew(t, dlocktest.Redis)
	conformance.RunChaos(t, harness{srv}, conformance.Config{Chaos: 10 * time.Second})
}

// A harness that embeds *dlocktest.Server has the server faults the
// conformance suite injects: here they pause a Redis server under the redis
// driver, and kill and restart it.
func Example() {
	ctx := context.Background()
	srv, err := dlocktest.Start(ctx, dlocktest.Redis, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	var h conformance.Harness = harness{srv}
	faults, ok := h.(conformance.ServerFaults)
	fmt.Println("server faults:", ok)

	l, err := dlock.Open(ctx, "redis://"+srv.Addr())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "example", nil); err != nil {
		fmt.Println(err)
		return
	}

	if err := faults.PauseServer(ctx); err != nil {
		fmt.Println(err)
		return
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = l.TryAcquire(short, "another", nil)
	cancel()
	fmt.Println("acquired while paused:", err == nil)
	if err := faults.ResumeServer(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// The test servers keep nothing across a restart: the lock is free.
	if err := faults.RestartServer(ctx); err != nil {
		fmt.Println(err)
		return
	}
	_, err = l.TryAcquire(ctx, "example", nil)
	fmt.Println("acquired after restart:", err == nil)
	// Output:
	// server faults: true
	// acquired while paused: false
	// acquired after restart: true
}
