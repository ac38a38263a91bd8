package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// serverMicros reads the server's clock (TIME) in µs.
func serverMicros(t *testing.T, raw *goredis.Client) uint64 {
	t.Helper()
	now, err := raw.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return uint64(now.UnixMicro())
}

// restartForgetting restarts srv (SIGKILL, then start) and checks, by a
// marker key set before it under prefix p, that the restart forgot the
// keys: the server runs without persistence.
func restartForgetting(t *testing.T, ctx context.Context, srv *servers.Server, raw *goredis.Client, p string) {
	t.Helper()
	marker := p + "restart-marker"
	if err := raw.Set(ctx, marker, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := raw.Exists(ctx, marker).Result(); err != nil || n != 0 {
		t.Fatalf("after the restart EXISTS %s = %d, %v; want 0 (a server without persistence)", marker, n, err)
	}
}

// A restart without persistence forgets the fencing counters, yet the next
// grant's token exceeds every token handed out before it: a missing counter
// starts at the server's clock in µs. A counter that exists (one an earlier
// version started at 1) keeps counting from its value.
func TestFenceAfterRestart(t *testing.T) {
	srv := servers.RequireNew(t, servers.Redis)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	p := testPrefix(t, raw)
	l := newLocker(t, newClient(t, srv.Addr()), &redis.Options{KeyPrefix: p})
	take := func(name string) uint64 {
		t.Helper()
		ls, err := l.Acquire(ctx, name, nil)
		if err != nil {
			t.Fatalf("Acquire %q: %v", name, err)
		}
		f, _ := ls.Fence()
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return f
	}

	if err := raw.Set(ctx, p+"{old}:fence", 41, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if f := take("old"); f != 42 {
		t.Errorf("fence from an existing counter at 41: %d, want 42", f)
	}

	before := serverMicros(t, raw)
	first := take("job")
	if after := serverMicros(t, raw); first < before || first > after {
		t.Errorf("a new counter's first fence %d is not the server's clock in µs (between %d and %d)", first, before, after)
	}
	last := first
	for range 3 {
		f := take("job")
		if f != last+1 {
			t.Errorf("fence %d after %d; want the counter INCRed", f, last)
		}
		last = f
	}

	restartForgetting(t, ctx, srv, raw, p)
	if f := take("job"); f <= last {
		t.Errorf("after the restart the fence is %d; want above %d, the last before it", f, last)
	}
	if f := take("old"); f <= 42 {
		t.Errorf("after the restart the fence of the formerly small counter is %d; want above 42", f)
	}
}

// Waiters queued across a restart without persistence: the grants after it
// (to a waiter that found its entry gone and asked again, and then by a
// handoff from the release script) carry tokens above every token handed out
// before it, by grant or by handoff, and increasing in grant order. The
// holder the restart robbed still believes it holds the lock: its token is
// what a fenced resource refuses. (The restart empties the queue too, so the
// first grant after it is never a handoff; TestFenceAfterCounterLost covers
// a handoff that finds the counter missing.)
func TestFenceAfterRestartQueued(t *testing.T) {
	srv := servers.RequireNew(t, servers.Redis)
	ctx := testCtx(t)
	addr := srv.Addr()
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{q}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	opts := &dlock.Options{TTL: 10 * time.Second}
	ls, err := holder.TryAcquire(ctx, "q", opts)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := ls.Fence()

	const n = 4
	type granted struct {
		i  int
		ls *dlock.Lease
	}
	grants := make(chan granted, n)
	errs := make(chan error, n)
	for i := range n {
		l := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
		go func() {
			lw, err := l.Acquire(ctx, "q", opts)
			if err != nil {
				errs <- err
				return
			}
			grants <- granted{i, lw}
		}()
		waitQueued(t, raw, key, int64(i+1))
	}
	next := func(what string) granted {
		t.Helper()
		var g granted
		select {
		case g = <-grants:
		case err := <-errs:
			t.Fatalf("%s: a waiter failed: %v", what, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("%s: no waiter granted within 15s", what)
		}
		f, _ := g.ls.Fence()
		if f <= last {
			t.Errorf("%s: waiter %d's fence %d does not exceed the previous %d", what, g.i, f, last)
		}
		last = f
		return g
	}

	// Two handoffs before the restart: waiters 0 and 1 in turn.
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := next("handoff before the restart")
	if err := g.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	robbed := next("second handoff before the restart")
	waitQueued(t, raw, key, n-2)

	restartForgetting(t, ctx, srv, raw, p)
	// One of the two waiters left takes the free lock; the other queues
	// behind it and is handed the lock by the release.
	g = next("first grant after the restart")
	waitQueued(t, raw, key, 1)
	if err := g.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g = next("handoff after the restart")
	if err := g.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The robbed holder's lock went with the restart.
	if err := robbed.ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of the lease the restart forgot: %v, want ErrNotHeld", err)
	}
	assertNoQueue(t, raw, key)
}

// A counter lost while the lock is held (evicted under an allkeys-*
// maxmemory policy, or deleted) starts again at the server's clock at the
// next grant, whichever script makes it: the release's handoff to the first
// waiter, or a waiter's takeover of a lock whose holder expired.
func TestFenceAfterCounterLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ttl of the holder's lease; expire: let it expire rather than
		// release it.
		ttl    time.Duration
		expire bool
	}{
		{"release handoff", 10 * time.Second, false},
		{"expiry takeover", 200 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			addr := redisAddr(t)
			raw := newClient(t, addr)
			p := testPrefix(t, raw)
			key := p + "{lost}"
			holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
			waiter := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
			ls, err := holder.TryAcquire(ctx, "lost", &dlock.Options{TTL: tc.ttl, NoRefresh: tc.expire})
			if err != nil {
				t.Fatal(err)
			}
			fh, _ := ls.Fence()
			done := acquireAsync(ctx, waiter, "lost", nil)
			waitQueued(t, raw, key, 1)
			if err := raw.Del(ctx, key+":fence").Err(); err != nil {
				t.Fatal(err)
			}
			if !tc.expire {
				if err := ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("the waiter was not granted within 15s")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if f, _ := r.ls.Fence(); f <= fh {
				t.Errorf("the waiter's fence %d does not exceed the holder's %d", f, fh)
			}
			if err := r.ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.expire {
				<-ls.Done()
			}
			assertNoQueue(t, raw, key)
		})
	}
}
