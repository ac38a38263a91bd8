package redlock_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
	"github.com/dlock/dlock/tests/internal/testutil"
	goredis "github.com/redis/go-redis/v9"
)

// scriptErrors counts the scripts that failed on one client (a timeout, a
// broken connection) while counting is on: the event a test waits for
// before it heals a fault, so that it heals after the request met it.
type scriptErrors struct {
	on       *atomic.Bool
	failed   atomic.Int64
	answered atomic.Int64 // scripts that succeeded while counting is on
}

func (h *scriptErrors) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *scriptErrors) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *scriptErrors) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); h.on.Load() && (name == "evalsha" || name == "eval") {
			if err != nil {
				h.failed.Add(1)
			} else {
				h.answered.Add(1)
			}
		}
		return err
	}
}

// A release that some nodes did not answer (partitioned: the requests time
// out) asks them again, and deletes the lock there once they can be
// reached: short of a majority, Release succeeds then, and a contender
// takes the lock at once instead of after the TTL; with a majority, it
// returns, and the minority is freed in the background.
func TestReleaseRetriesNodes(t *testing.T) {
	c := newCluster(t, 3, nil)
	for _, tc := range []struct {
		name string
		cut  []int
	}{
		{"majority", []int{1, 2}},
		{"minority", []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) { testReleaseRetriesNodes(t, c, tc.cut) })
	}
}

func testReleaseRetriesNodes(t *testing.T, c *cluster, cut []int) {
	ctx := testutil.Ctx(t)
	clients, ps := c.proxied(t)
	var on atomic.Bool
	hooks := make([]*scriptErrors, len(clients))
	for i, cl := range clients {
		hooks[i] = &scriptErrors{on: &on}
		cl.AddHook(hooks[i])
	}
	const ttl = 20 * time.Second
	l := newLocker(t, clients, &redlock.Options{NodeTimeout: nodeTimeout, Defaults: dlock.Options{TTL: ttl}})
	contender := newLocker(t, c.clients(t), &redlock.Options{NodeTimeout: nodeTimeout})
	name := "release-retry-" + testutil.RandomHex(4)
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	// TryAcquire returns once a majority took the lock; the third node's
	// request may still be on its way (busy run 26: 2 of 3 at load 8).
	eventually(t, nodeTimeout+slack(t), "the lock on all 3 nodes", func() bool {
		return c.holders(t, lockKey(name), ls.Token()) == 3
	})

	for _, i := range cut {
		ps[i].Blackhole()
	}
	on.Store(true)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- ls.Release(ctx) }()
	// Heal once the release's requests to the cut nodes have timed out.
	eventually(t, nodeTimeout+slack(t), "the release timed out on the cut nodes", func() bool {
		for _, i := range cut {
			if hooks[i].failed.Load() == 0 {
				return false
			}
		}
		return true
	})
	for _, i := range cut {
		ps[i].Heal()
	}
	var rerr error
	select {
	case rerr = <-done:
	case <-time.After(live(t, 5*time.Second)):
		t.Fatal("Release did not return within 5s of the heal")
	}
	t.Logf("released in %v", time.Since(start))
	if rerr != nil {
		t.Fatalf("Release with the cut nodes back: %v", rerr)
	}
	eventually(t, live(t, 5*time.Second), "the lock deleted on every node", func() bool {
		return c.holders(t, lockKey(name), ls.Token()) == 0
	})
	// Well before the TTL: nothing is left in the contender's way.
	if took := time.Since(start); took > ttl/2 {
		t.Fatalf("the lock was left for %v, half the TTL", took)
	}
	// Nothing in the way: the contender is not refused as held. An
	// attempt whose nodes answer past the node timeout on a loaded machine
	// (busy run 31: 2 of 3 at load ~12) tells nothing either way, and is
	// tried again.
	other, err := contender.TryAcquire(ctx, name, nil)
	for try := 0; errors.Is(err, redlock.ErrNoQuorum) && try < 10; try++ {
		time.Sleep(100 * time.Millisecond)
		other, err = contender.TryAcquire(ctx, name, nil)
	}
	if err != nil {
		t.Fatalf("TryAcquire after the release, %v before the TTL ran out: %v", ttl-time.Since(start), err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A release's retries run the token-checked script: a node whose lock
// expired and was taken by another while it could not be reached is left
// to its new owner.
func TestReleaseRetryKeepsNewOwner(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	clients, ps := c.proxied(t)
	var on atomic.Bool
	hooks := make([]*scriptErrors, len(clients))
	for i, cl := range clients {
		hooks[i] = &scriptErrors{on: &on}
		cl.AddHook(hooks[i])
	}
	// 6s: the release's retries go on for a TTL after it began, and on a
	// loaded machine the contender's Acquire and the heal took most of a
	// 4s one (busy run 32: no retry answered after the heal).
	const ttl = 6 * time.Second
	l := newLocker(t, clients, &redlock.Options{NodeTimeout: nodeTimeout, Defaults: dlock.Options{TTL: ttl, NoRefresh: true}})
	contender := newLocker(t, c.clients(t), &redlock.Options{NodeTimeout: nodeTimeout})
	name := "release-owner-" + testutil.RandomHex(4)
	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Release three quarters of a TTL in: its retries go on (in the
	// background once Release has returned, which it does after three
	// node timeouts short of a majority) until a TTL after it began, for
	// 4.5s past the lock's expiry (unrefreshed) on the cut nodes, time for
	// the contender to take them and the heal to come.
	time.Sleep(ttl * 3 / 4)
	ps[1].Blackhole()
	ps[2].Blackhole()
	on.Store(true)
	done := make(chan error, 1)
	go func() { done <- ls.Release(ctx) }()
	eventually(t, nodeTimeout+slack(t), "the release timed out on nodes 1 and 2", func() bool {
		return hooks[1].failed.Load() > 0 && hooks[2].failed.Load() > 0
	})
	// Node 0 was released; 1 and 2 expire: the contender takes them (a
	// majority of the three, or all).
	other, err := contender.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	owned := holding(t, c, lockKey(name), other.Token())
	if !slices.Contains(owned, 1) && !slices.Contains(owned, 2) {
		t.Fatalf("the contender holds nodes %v, neither of the cut ones", owned)
	}
	// By now Release has given up waiting (ErrNoQuorum) or, on a slow
	// machine, may still be retrying; either way its retries go on.
	ps[1].Heal()
	ps[2].Heal()
	if err := <-done; err != nil && !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release: %v, want nil or ErrNoQuorum", err)
	}
	// The retries reach nodes 1 and 2, which no longer hold its token (the
	// lost first answers could have been deletions).
	eventually(t, live(t, 5*time.Second), "the release's retries answered by nodes 1 and 2", func() bool {
		return hooks[1].answered.Load() > 0 && hooks[2].answered.Load() > 0
	})
	if after := holding(t, c, lockKey(name), other.Token()); !slices.Equal(after, owned) {
		t.Fatalf("the contender's lock is on nodes %v after the release's retries, was on %v", after, owned)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// holding lists the nodes on which key holds value.
func holding(t testing.TB, c *cluster, key, value string) []int {
	t.Helper()
	var on []int
	for i, r := range c.raws {
		v, err := r.Get(context.Background(), key).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatalf("GET %s on node %d: %v", key, i, err)
		}
		if err == nil && v == value {
			on = append(on, i)
		}
	}
	return on
}
