package redis_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// waitQueued waits until the queue of key holds n entries (an event on the
// server, polled).
func waitQueued(t *testing.T, raw *goredis.Client, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := raw.ZCard(context.Background(), key+":queue").Result()
		if err != nil {
			t.Fatalf("ZCARD: %v", err)
		}
		if m == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s:queue has %d entries, want %d", key, m, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// assertNoQueue fails unless the queue and the waiter entries of key are
// gone (Redis deletes an emptied ZSET or HASH).
func assertNoQueue(t *testing.T, raw *goredis.Client, key string) {
	t.Helper()
	for _, k := range []string{key + ":queue", key + ":waiters"} {
		if n, err := raw.Exists(context.Background(), k).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s = %d, %v; want 0", k, n, err)
		}
	}
}

func TestCapabilitiesFIFO(t *testing.T) {
	c := newClient(t, redisAddr(t))
	if !newLocker(t, c, nil).Capabilities().FIFO {
		t.Error("the default layout does not declare FIFO")
	}
	if newLocker(t, c, &redis.Options{Compat: true}).Capabilities().FIFO {
		t.Error("the compat layout declares FIFO")
	}
}

// Five waiters queued in a known order are granted in that order, each by a
// handoff: no waiter sends anything between the first release and its
// grant. Fences strictly increase through the handoffs, and the queue keys
// vanish once the queue is empty.
func TestFIFOHandoff(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{fifo}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	ls, err := holder.TryAcquire(ctx, "fifo", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := ls.Fence()

	const n = 5
	type granted struct {
		i     int
		fence uint64
		err   error
	}
	order := make(chan granted, n)
	counts := make([]*attempts, n)
	for i := range n {
		counts[i] = &attempts{key: key}
		l := newLocker(t, newClient(t, addr, counts[i]), &redis.Options{KeyPrefix: p})
		go func() {
			lw, err := l.Acquire(ctx, "fifo", nil)
			if err != nil {
				order <- granted{i, 0, err}
				return
			}
			f, _ := lw.Fence()
			order <- granted{i, f, lw.Release(ctx)} // hands on to the next
		}()
		waitQueued(t, raw, key, int64(i+1))
	}
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The grant order is the fence order (each grant INCRs the counter); the
	// order of arrival on the channel is not, as a waiter hands on before
	// it reports.
	got := make([]granted, 0, n)
	for range n {
		select {
		case g := <-order:
			if g.err != nil {
				t.Fatalf("waiter %d: %v", g.i, g.err)
			}
			got = append(got, g)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d waiters granted within 5s", len(got), n)
		}
	}
	slices.SortFunc(got, func(a, b granted) int { return cmp.Compare(a.fence, b.fence) })
	for want, g := range got {
		if g.i != want {
			t.Fatalf("waiter %d granted in place %d, want in arrival order", g.i, want)
		}
		if g.fence <= last {
			t.Errorf("waiter %d: fence %d does not exceed the previous %d", g.i, g.fence, last)
		}
		last = g.fence
	}
	for i, c := range counts {
		if m := c.since(released); m != 0 {
			t.Errorf("waiter %d ran acquire.lua %d times after the release; want 0 (handed over)", i, m)
		}
	}
	assertNoQueue(t, raw, key)
}

// A waiter that gives up leaves no queue entry behind, and a lock handed to
// it while it was giving up is passed on to the next waiter at once rather
// than sitting idle for its TTL.
func TestCancelledWaiterPassesGrantOn(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{c}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	slow := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
	next := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	opts := &dlock.Options{TTL: 10 * time.Second}
	ls, err := holder.TryAcquire(ctx, "c", opts)
	if err != nil {
		t.Fatal(err)
	}

	// Cancelled while queued: the entry is gone when Acquire returns.
	wctx, cancel := context.WithCancel(ctx)
	first := acquireAsync(wctx, slow, "c", opts)
	waitQueued(t, raw, key, 1)
	cancel()
	if r := <-first; !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, dlock.ErrNotAcquired) {
		t.Fatalf("cancelled Acquire: %v; want ErrNotAcquired and context.Canceled", r.err)
	}
	waitQueued(t, raw, key, 0)
	assertNoQueue(t, raw, key)

	// Cancelled as the lock is handed to it: the grant message is still on
	// its way (100ms of latency) when the wait is cancelled.
	wctx, cancel = context.WithCancel(ctx)
	defer cancel()
	first = acquireAsync(wctx, slow, "c", opts)
	waitQueued(t, raw, key, 1)
	second := acquireAsync(ctx, next, "c", opts)
	waitQueued(t, raw, key, 2)
	proxy.SetLatency(100 * time.Millisecond)
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := raw.Get(ctx, key).Result(); v == "" {
		t.Fatal("the release did not hand the lock to the first waiter")
	}
	cancel()
	if r := <-first; r.err == nil {
		_ = r.ls.Release(ctx)
		t.Fatal("the cancelled waiter was granted")
	}
	var r result
	select {
	case r = <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the next waiter was not granted within 5s (the handed lock has 10s)")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if lag := r.at.Sub(released); lag > time.Second {
		t.Errorf("next waiter granted %v after the release; want < 1s", lag)
	}
	proxy.SetLatency(0)
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoQueue(t, raw, key)
}

// A waiter that can no longer renew its entry (its path black-holed) is
// skipped once the entry's lifetime has passed: the release goes to the live
// waiter behind it. An entry that is still live when the lock is handed to
// it (inserted and never renewed) costs at most the lock's TTL: the next
// waiter takes over when that expires. The queue keys expire with their
// entries.
func TestDeadWaiterSkipped(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{d}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	dead := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
	live := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})

	ls, err := holder.TryAcquire(ctx, "d", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// TTL 200ms: the entry lives 1s (the minimum) after its last renewal.
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	deadDone := acquireAsync(dctx, dead, "d", &dlock.Options{TTL: 200 * time.Millisecond})
	waitQueued(t, raw, key, 1)
	proxy.Blackhole()
	enqueued := time.Now()
	if pttl, _ := raw.PTTL(ctx, key+":queue").Result(); pttl <= 0 || pttl > time.Second {
		t.Errorf("PTTL of the queue %v; want in (0, 1s]: the entry's lifetime", pttl)
	}
	liveDone := acquireAsync(ctx, live, "d", nil)
	waitQueued(t, raw, key, 2)
	time.Sleep(time.Until(enqueued.Add(time.Second + 100*time.Millisecond)))
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-liveDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	proxy.Heal()
	dcancel()
	<-deadDone

	// A ghost entry, live for 5s, never renewed, ahead of a live waiter.
	now, err := raw.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const ghostTTL = 300 * time.Millisecond
	raw.ZAdd(ctx, key+":queue", goredis.Z{Score: 1, Member: "ghost"})
	raw.HSet(ctx, key+":waiters", "ghost", fmt.Sprintf("%d %d", now.Add(5*time.Second).UnixMilli(), ghostTTL.Milliseconds()))
	raw.PExpire(ctx, key+":queue", 5*time.Second)
	raw.PExpire(ctx, key+":waiters", 5*time.Second)
	// The live waiter renews every third of its entry's 1s lifetime, and
	// finds the ghost's lock expired at the first renewal after its TTL.
	liveDone = acquireAsync(ctx, live, "d", &dlock.Options{TTL: ghostTTL})
	waitQueued(t, raw, key, 2)
	released := time.Now()
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := raw.Get(ctx, key).Result(); v != "ghost" {
		t.Fatalf("the lock holds %q after the release; want it handed to the ghost", v)
	}
	r = <-liveDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	if lag := r.at.Sub(released); lag < ghostTTL-10*time.Millisecond || lag > ghostTTL+time.Second/3+150*time.Millisecond {
		t.Errorf("live waiter granted %v after the handoff to the ghost; want within its %v TTL and a renewal interval", lag, ghostTTL)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoQueue(t, raw, key)
}

// TryAcquire never enqueues, and does not take a lock that is free only
// because its holder expired while a live waiter is queued: it hands it to
// that waiter and reports busy.
func TestTryAcquireNoBarging(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{t}"
	l := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	ls, err := l.TryAcquire(ctx, "t", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "t", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held lock: %v; want ErrNotAcquired", err)
	}
	assertNoQueue(t, raw, key)
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A live waiter's entry, the lock free (its holder expired).
	now, err := raw.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	raw.ZAdd(ctx, key+":queue", goredis.Z{Score: 1, Member: "waiter"})
	raw.HSet(ctx, key+":waiters", "waiter", fmt.Sprintf("%d 5000", now.Add(5*time.Second).UnixMilli()))
	sub := raw.Subscribe(ctx, key+":released")
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	fence, _ := raw.Get(ctx, key+":fence").Uint64()
	_, err = l.TryAcquire(ctx, "t", nil)
	var busy *dlockdriver.BusyError
	if !errors.As(err, &busy) || busy.RetryAfter <= 4*time.Second {
		t.Fatalf("TryAcquire with a live waiter queued: %v; want busy for the waiter's 5s", err)
	}
	if v, _ := raw.Get(ctx, key).Result(); v != "waiter" {
		t.Errorf("the lock holds %q; want it handed to the queued waiter", v)
	}
	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	if m, ok := msg.(*goredis.Message); err != nil || !ok || m.Payload != fmt.Sprintf("g:waiter:%d", fence+1) {
		t.Errorf("got %v, %v; want the grant message g:waiter:%d", msg, err, fence+1)
	}
	assertNoQueue(t, raw, key)
	raw.Del(ctx, key)
}

// A waiter whose grant message is lost (the pub/sub connection reset right
// after the handoff) finds it held for its token when it looks again, with
// the fence of that handoff.
func TestHandoffFoundWithoutMessage(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{m}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	waiter := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
	ls, err := holder.TryAcquire(ctx, "m", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, waiter, "m", nil)
	waitQueued(t, raw, key, 1)
	proxy.Blackhole()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	fence, _ := raw.Get(ctx, key+":fence").Uint64()
	time.Sleep(100 * time.Millisecond)
	proxy.Reset() // the grant message was sent into the black hole
	proxy.Heal()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if f, _ := r.ls.Fence(); f != fence {
		t.Errorf("fence %d; want %d, the handoff's", f, fence)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoQueue(t, raw, key)
}

// A handoff is announced to the grantee's Locker alone: on that Locker's
// grant channel (P grants:<id>, named in the waiter's entry), and on no other
// Locker's channel nor on the name's release channel. Three Lockers wait;
// a pattern subscriber sees exactly one grant message per handoff, then a
// marker published after the release returned.
func TestGrantReachesOnlyTheGrantee(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "{solo}"
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	ls, err := holder.TryAcquire(ctx, "solo", nil)
	if err != nil {
		t.Fatal(err)
	}
	sub := raw.PSubscribe(ctx, p+"*")
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the confirmation
		t.Fatal(err)
	}

	const n = 3
	waits := make([]<-chan result, n)
	for i := range waits {
		waits[i] = acquireAsync(ctx, newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p}), "solo", nil)
		waitQueued(t, raw, key, int64(i+1))
	}
	entries, err := raw.HGetAll(ctx, key+":waiters").Result()
	if err != nil {
		t.Fatal(err)
	}
	channels := map[string]string{} // token -> grant channel
	for tok, e := range entries {
		var deadline, ttl int64
		var ch string
		if _, err := fmt.Sscanf(e, "%d %d %s", &deadline, &ttl, &ch); err != nil || !strings.HasPrefix(ch, p+"grants:") {
			t.Fatalf("entry %q = %q (%v); want \"deadline ttl %sgrants:<id>\"", tok, e, err, p)
		}
		channels[tok] = ch
	}
	if len(channels) != n {
		t.Fatalf("%d waiter entries, want %d", len(channels), n)
	}

	for i := range n {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-waits[i]
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		ls = r.ls
		if err := raw.Publish(ctx, p+"marker", "m").Err(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			m, ok := msg.(*goredis.Message)
			if !ok {
				continue
			}
			if m.Channel == p+"marker" {
				break
			}
			got = append(got, m.Channel+" "+m.Payload)
		}
		fence, _ := ls.Fence()
		want := fmt.Sprintf("%s g:%s:%d", channels[ls.Token()], ls.Token(), fence)
		if len(got) != 1 || got[0] != want {
			t.Errorf("handoff %d: messages %q; want only %q", i, got, want)
		}
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoQueue(t, raw, key)
}
