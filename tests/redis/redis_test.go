package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testexport/redisexport"
	"github.com/dlock/dlock/redis"
	"github.com/dlock/dlock/tests/internal/testutil"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { dlocktest.Main(m) }

// redisAddr returns the address of the test binary's shared Redis server.
func redisAddr(t testing.TB) string {
	t.Helper()
	return dlocktest.Require(t, dlocktest.Redis).Addr()
}

// newClient returns a go-redis client on addr, closed at cleanup.
func newClient(t testing.TB, addr string, hooks ...goredis.Hook) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testPrefix returns a key prefix unique to t and, at cleanup (after the
// lockers registered later are closed), fails the test if anything but the
// fencing counters the default layout keeps by design is left under it, then
// deletes what is there.
func testPrefix(t *testing.T, raw *goredis.Client) string {
	t.Helper()
	p := "dlocktest:" + testutil.RandomHex(4) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var left []string
		iter := raw.Scan(ctx, 0, p+"*", 100).Iterator()
		for iter.Next(ctx) {
			left = append(left, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("SCAN %s*: %v", p, err)
			return
		}
		for _, k := range left {
			if !isCounter(k) {
				t.Errorf("key %q left behind", k)
			}
		}
		if len(left) > 0 {
			raw.Del(ctx, left...)
		}
	})
	return p
}

// isCounter reports whether k is a fencing counter, which the default
// layout keeps by design: a lock's, a semaphore's or a read/write lock's.
func isCounter(k string) bool {
	for _, s := range []string{"}:fence", "}:permits:fence", "}:rw:fence"} {
		if strings.HasSuffix(k, s) {
			return true
		}
	}
	return false
}

// newLocker returns a Locker on client, closed at cleanup.
func newLocker(t testing.TB, client goredis.UniversalClient, opts *redis.Options) *dlock.Locker {
	t.Helper()
	l, err := redis.New(client, opts)
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

// attempts counts acquisition attempts on one lock key seen by a client:
// runs of acquire.lua on that key (an EVALSHA answered NOSCRIPT and its EVAL
// are one attempt), with the time each was sent.
type attempts struct {
	key  string
	mu   sync.Mutex
	sent []time.Time
}

func (a *attempts) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sent)
}

// since counts the attempts sent at or after t.
func (a *attempts) since(t time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, s := range a.sent {
		if !s.Before(t) {
			n++
		}
	}
	return n
}

func (a *attempts) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (a *attempts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (a *attempts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		// EVALSHA|EVAL script numkeys key… token ttl
		args := cmd.Args()
		if n := strings.ToLower(cmd.Name()); (n == "evalsha" || n == "eval") && len(args) > 4 && args[3] == a.key {
			if src := fmt.Sprint(args[1]); src == acquireSHA || strings.Contains(src, "acquire.lua") {
				sent := time.Now()
				err := next(ctx, cmd)
				if err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
					a.mu.Lock()
					a.sent = append(a.sent, sent)
					a.mu.Unlock()
				}
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// acquireSHA is the SHA-1 that EVALSHA names acquire.lua by.
var acquireSHA = redisexport.AcquireScript.Hash()

// waitSubscribers waits until channel has n subscribers on the server.
func waitSubscribers(t *testing.T, raw *goredis.Client, channel string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := raw.PubSubNumSub(context.Background(), channel).Result()
		if err != nil {
			t.Fatalf("PUBSUB NUMSUB: %v", err)
		}
		if m[channel] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d subscribers, want %d", channel, m[channel], n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type result struct {
	ls  *dlock.Lease
	err error
	at  time.Time
}

// acquireAsync starts an Acquire and returns where its outcome arrives.
func acquireAsync(ctx context.Context, l *dlock.Locker, name string, o *dlock.Options) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, o)
		c <- result{ls, err, time.Now()}
	}()
	return c
}

// The default layout: a string key P{N} holding the token with the TTL as
// expiry, a fencing counter P{N}:fence, no release message on P{N}:released
// when nobody is queued; after release only the counter is left.
func TestLayout(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})

	ls, err := l.TryAcquire(ctx, "job", &dlock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key, fenceKey, channel := p+"{job}", p+"{job}:fence", p+"{job}:released"
	if got, err := raw.Get(ctx, key).Result(); err != nil || got != ls.Token() {
		t.Errorf("GET %s = %q, %v; want the token %q", key, got, err, ls.Token())
	}
	if pttl, err := raw.PTTL(ctx, key).Result(); err != nil || pttl <= 4*time.Second || pttl > 5*time.Second {
		t.Errorf("PTTL %s = %v, %v; want in (4s, 5s]", key, pttl, err)
	}
	fence, ok := ls.Fence()
	if !ok {
		t.Fatal("Fence() reports no fencing in the default layout")
	}
	if got, err := raw.Get(ctx, fenceKey).Uint64(); err != nil || got != fence {
		t.Errorf("GET %s = %d, %v; want the fence %d", fenceKey, got, err, fence)
	}
	if pttl, _ := raw.PTTL(ctx, fenceKey).Result(); pttl != -1 {
		t.Errorf("the fencing counter has a TTL (%v); it must persist", pttl)
	}
	if s1, s2 := raw.ClusterKeySlot(ctx, key).Val(), raw.ClusterKeySlot(ctx, fenceKey).Val(); s1 != s2 {
		t.Errorf("lock and counter hash to slots %d and %d", s1, s2)
	}

	sub := raw.Subscribe(ctx, channel)
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the confirmation
		t.Fatal(err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// With nobody queued the release publishes nothing: the first message
	// after it is a marker published once it had returned.
	if err := raw.Publish(ctx, channel, "marker").Err(); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	if m, ok := msg.(*goredis.Message); err != nil || !ok || m.Payload != "marker" {
		t.Errorf("after release got %v, %v; want only the marker on %s", msg, err, channel)
	}
	if n, _ := raw.Exists(ctx, key).Result(); n != 0 {
		t.Errorf("%s still exists after release", key)
	}
	if got, err := raw.Get(ctx, fenceKey).Uint64(); err != nil || got != fence {
		t.Errorf("after release GET %s = %d, %v; want %d kept", fenceKey, got, err, fence)
	}
}

// The compat layout: the key is exactly prefix+name (prefix "" by default),
// holding the token; no fencing counter; Fencing is not declared.
func TestLayoutCompat(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	for _, tc := range []struct {
		name   string
		prefix string
		key    string
	}{
		{"explicit prefix", p, p + "job"},
		{"default empty prefix", "", p + "job2"}, // the whole key is the name
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: tc.prefix, Compat: true})
			if l.Capabilities().Fencing {
				t.Error("compat mode declares Fencing")
			}
			name := strings.TrimPrefix(tc.key, tc.prefix)
			ls, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := raw.Get(ctx, tc.key).Result(); err != nil || got != ls.Token() {
				t.Errorf("GET %s = %q, %v; want the token", tc.key, got, err)
			}
			if _, ok := ls.Fence(); ok {
				t.Error("a compat lease has a fence")
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := raw.Exists(ctx, tc.key).Result(); n != 0 {
				t.Errorf("%s still exists after release", tc.key)
			}
		})
	}
}

// Fencing tokens strictly increase across release and across a takeover
// after the holder's lock expired, for holders on different Lockers.
func TestFenceIncreases(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	opts := &redis.Options{KeyPrefix: p}
	a := newLocker(t, newClient(t, redisAddr(t)), opts)
	b := newLocker(t, newClient(t, redisAddr(t)), opts)

	l1, err := a.TryAcquire(ctx, "f", nil)
	if err != nil {
		t.Fatal(err)
	}
	f1, _ := l1.Fence()
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// 500ms, not less: the test is about fences, and under load (two busy
	// loops) a 50ms grant came back expired (reply 58ms after the request).
	l2, err := b.TryAcquire(ctx, "f", &dlock.Options{TTL: 500 * time.Millisecond, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	f2, _ := l2.Fence()
	<-l2.Done() // expired, never released
	l3, err := a.Acquire(ctx, "f", nil)
	if err != nil {
		t.Fatal(err)
	}
	f3, _ := l3.Fence()
	if !(f1 < f2 && f2 < f3) {
		t.Errorf("fences %d, %d, %d; want strictly increasing", f1, f2, f3)
	}
	if err := l2.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of the expired lease: %v, want ErrNotHeld", err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Release and Refresh compare the token: they fail with ErrNotHeld and touch
// nothing once the key is gone or belongs to someone else, Refresh never
// re-creates the key, and Held reads the token.
func TestTokenCompared(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	key := p + "{t}"

	ls, err := l.TryAcquire(ctx, "t", &dlock.Options{NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held = %v, %v; want true", ok, err)
	}
	raw.Del(ctx, key)
	if err := ls.Refresh(ctx, 0); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after the key was deleted: %v, want ErrNotHeld", err)
	}
	if n, _ := raw.Exists(ctx, key).Result(); n != 0 {
		t.Error("Refresh re-created the deleted key")
	}

	ls, err = l.TryAcquire(ctx, "t", &dlock.Options{NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	raw.Set(ctx, key, "someone-else", time.Minute)
	if ok, err := ls.Held(ctx); ok || err != nil {
		t.Errorf("Held after a takeover = %v, %v; want false, nil", ok, err)
	}
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release after a takeover: %v, want ErrNotHeld", err)
	}
	if v, _ := raw.Get(ctx, key).Result(); v != "someone-else" {
		t.Errorf("Release removed or changed the new holder's key: %q", v)
	}
	raw.Del(ctx, key)
}

// A key under the lock's name without expiry (set by something else) counts
// as held, with no remaining-time hint; a TTL below a millisecond step is
// rounded up, never down.
func TestBusyHints(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	for _, compat := range []bool{false, true} {
		t.Run(fmt.Sprintf("compat=%v", compat), func(t *testing.T) {
			l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p, Compat: compat})
			key := p + "{x}"
			if compat {
				key = p + "x"
			}
			raw.Set(ctx, key, "foreign", 0)
			defer raw.Del(ctx, key)
			_, err := l.TryAcquire(ctx, "x", nil)
			var busy *dlockdriver.BusyError
			if !errors.As(err, &busy) || busy.RetryAfter != 0 {
				t.Errorf("TryAcquire over a key without expiry: %v; want a BusyError without hint", err)
			}
			raw.Set(ctx, key, "foreign", 3*time.Second)
			_, err = l.TryAcquire(ctx, "x", nil)
			if !errors.As(err, &busy) || busy.RetryAfter <= 2*time.Second || busy.RetryAfter > 3*time.Second {
				t.Errorf("TryAcquire over a key with 3s left: %v; want a BusyError with a hint in (2s, 3s]", err)
			}
			raw.Del(ctx, key)

			ls, err := l.TryAcquire(ctx, "x", &dlock.Options{TTL: 20*time.Millisecond + 300*time.Microsecond, NoRefresh: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := ls.TTL(); got != 21*time.Millisecond {
				t.Errorf("granted TTL %v, want 21ms (rounded up)", got)
			}
			if pttl, _ := raw.PTTL(ctx, key).Result(); pttl <= 0 || pttl > 21*time.Millisecond {
				t.Errorf("PTTL %v, want in (0, 21ms]", pttl)
			}
			_ = ls.Release(ctx)
		})
	}
}

// dlock in compat mode, redsync and redislock exclude each other on the same
// name, in both directions, and a release by either side lets the other in.
func TestCompatInterop(t *testing.T) {
	ctx := testutil.Ctx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p, Compat: true})
	other := newClient(t, redisAddr(t))
	rs := redsync.New(redsyncgoredis.NewPool(other))
	rl := redislock.New(other)

	type foreign struct {
		obtain  func(key string) error // nil when obtained
		release func() error
	}
	libs := map[string]func() foreign{
		"redsync": func() foreign {
			var m *redsync.Mutex
			return foreign{
				obtain: func(key string) error {
					m = rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(1))
					return m.TryLockContext(ctx)
				},
				release: func() error {
					ok, err := m.UnlockContext(ctx)
					if err == nil && !ok {
						err = errors.New("redsync: unlock not done")
					}
					return err
				},
			}
		},
		"redislock": func() foreign {
			var lk *redislock.Lock
			return foreign{
				obtain: func(key string) (err error) {
					lk, err = rl.Obtain(ctx, key, 10*time.Second, nil)
					return err
				},
				release: func() error { return lk.Release(ctx) },
			}
		},
	}
	for lib, mk := range libs {
		t.Run(lib, func(t *testing.T) {
			name := lib + "-" + testutil.RandomHex(3)
			key := p + name
			f := mk()

			// dlock holds: the library cannot obtain; after release it can.
			ls, err := l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.obtain(key); err == nil {
				t.Fatalf("%s obtained %s while dlock holds it", lib, key)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := f.obtain(key); err != nil {
				t.Fatalf("%s could not obtain %s after dlock released it: %v", lib, key, err)
			}

			// The library holds: dlock cannot acquire; after release it can.
			_, err = l.TryAcquire(ctx, name, nil)
			var busy *dlockdriver.BusyError
			if !errors.As(err, &busy) || busy.RetryAfter <= 9*time.Second {
				t.Fatalf("TryAcquire while %s holds: %v; want busy for ~10s", lib, err)
			}
			if err := f.release(); err != nil {
				t.Fatal(err)
			}
			ls, err = l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatalf("TryAcquire after %s released: %v", lib, err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A dlock waiter behind a redsync lock, whose release publishes nothing, is
// granted once the holder's remaining TTL (read at its failed attempt) has
// passed: a few attempts, no fixed-interval polling.
func TestCompatWaiterBehindForeignLock(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	key := p + "w"
	count := &attempts{key: key}
	l := newLocker(t, newClient(t, addr, count), &redis.Options{KeyPrefix: p, Compat: true})
	m := redsync.New(redsyncgoredis.NewPool(raw)).NewMutex(key, redsync.WithExpiry(time.Second), redsync.WithTries(1))
	if err := m.TryLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	held := time.Now()
	done := acquireAsync(ctx, l, "w", nil)
	time.Sleep(200 * time.Millisecond)
	if _, err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.ls.Release(ctx)
	if wait := r.at.Sub(held); wait > 1500*time.Millisecond {
		t.Errorf("granted %v after the redsync lock was taken; want by its 1s TTL (+500ms tolerance)", wait)
	}
	if n := count.count(); n < 2 || n > 3 {
		t.Errorf("%d acquisition attempts while waiting; want 2 or 3 (no polling)", n)
	}
}

// A blocked waiter is granted within a fraction of a second of the release,
// although the holder had 10s left: notified waiting, not polling; it made
// only a couple of attempts.
func TestNotifiedOnRelease(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	count := &attempts{key: p + "{n}"}
	waiter := newLocker(t, newClient(t, addr, count), &redis.Options{KeyPrefix: p})

	ls, err := holder.TryAcquire(ctx, "n", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, waiter, "n", nil)
	waitSubscribers(t, raw, p+"{n}:released", 1)
	time.Sleep(50 * time.Millisecond)
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	lag := r.at.Sub(released)
	t.Logf("granted %v after the release", lag)
	if lag > time.Second {
		t.Errorf("waiter granted %v after the release; want < 1s (the holder had 10s left)", lag)
	}
	if n := count.count(); n < 2 || n > 3 {
		t.Errorf("%d attempts; want 2 or 3", n)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, raw, p+"{n}:released", 0) // unsubscribed once no one waits
}

// A waiter on a lock whose holder expires without releasing is granted
// right after the expiry (within 150ms), after at most 3 attempts.
func TestGrantedAtExpiry(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	count := &attempts{key: p + "{e}"}
	waiter := newLocker(t, newClient(t, addr, count), &redis.Options{KeyPrefix: p})

	const ttl = 700 * time.Millisecond
	start := time.Now()
	ls, err := holder.TryAcquire(ctx, "e", &dlock.Options{TTL: ttl, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, waiter, "e", nil)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	waited := r.at.Sub(start)
	t.Logf("granted %v after the holder's acquire (TTL %v)", waited, ttl)
	if waited < ttl-10*time.Millisecond { // measured from before the holder's request
		t.Errorf("granted after %v, before the holder's TTL %v ran out", waited, ttl)
	}
	if waited > ttl+150*time.Millisecond {
		t.Errorf("granted after %v; want within 150ms of the holder's expiry at %v", waited, ttl)
	}
	if n := count.count(); n < 2 || n > 3 {
		t.Errorf("%d attempts; want 2 or 3 (no polling)", n)
	}
	<-ls.Done()
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Waiters of one Locker share one subscription per name, which is dropped
// when the last of them stops waiting.
func TestSharedSubscription(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	waiter := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	ls, err := holder.TryAcquire(ctx, "s", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := waiter.Acquire(wctx, "s", nil); !errors.Is(err, context.Canceled) || !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("cancelled Acquire: %v; want ErrNotAcquired and context.Canceled", err)
			}
		}()
	}
	channel := p + "{s}:released"
	waitSubscribers(t, raw, channel, 1)
	time.Sleep(100 * time.Millisecond)
	waitSubscribers(t, raw, channel, 1) // still one for five waiters
	cancel()
	wg.Wait()
	waitSubscribers(t, raw, channel, 0)
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// When the pub/sub connection is reset, waiters are resubscribed on a new
// connection and a release reaches them within a fraction of a second,
// whether it comes before the resubscription (they are woken when it is
// confirmed) or after it.
func TestNotifiedAfterReset(t *testing.T) {
	for _, early := range []bool{true, false} {
		t.Run(fmt.Sprintf("release before resubscription=%v", early), func(t *testing.T) {
			ctx := testutil.Ctx(t)
			addr := redisAddr(t)
			raw := newClient(t, addr)
			p := testPrefix(t, raw)
			proxy := faultnet.ListenT(t, addr)
			holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
			waiter := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
			ls, err := holder.TryAcquire(ctx, "r", &dlock.Options{TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			channel := p + "{r}:released"
			done := acquireAsync(ctx, waiter, "r", nil)
			waitSubscribers(t, raw, channel, 1)
			before := pubsubClients(t, raw)
			proxy.Reset()
			if !early {
				deadline := time.Now().Add(5 * time.Second)
				for {
					// The holder's Locker keeps its own (it listens for
					// a steal of its lease): the waiter's is replaced.
					after := pubsubClients(t, raw)
					fresh := slices.DeleteFunc(slices.Clone(after), func(id string) bool { return slices.Contains(before, id) })
					if len(fresh) == 1 && len(after) == len(before) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("pub/sub clients %v after the reset (before: %v); want the waiter's replaced by one new one", after, before)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			released := time.Now()
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if lag := r.at.Sub(released); lag > time.Second {
				t.Errorf("granted %v after the release; want < 1s", lag)
			}
			if err := r.ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A release published while the waiter's path is partitioned is lost; when
// the partition heals, the broken pub/sub connection is replaced and the
// waiter, woken, is granted within a fraction of a second rather than at the
// holder's TTL.
func TestNotifiedAfterPartition(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	proxy := faultnet.ListenT(t, addr)
	holder := newLocker(t, newClient(t, addr), &redis.Options{KeyPrefix: p})
	waiter := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
	ls, err := holder.TryAcquire(ctx, "q", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, waiter, "q", nil)
	waitSubscribers(t, raw, p+"{q}:released", 1)
	proxy.Blackhole()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	healed := time.Now()
	proxy.Heal()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if lag := r.at.Sub(healed); lag > time.Second {
		t.Errorf("granted %v after the heal; want < 1s (the holder had 10s left)", lag)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// pubsubClients lists the ids of the server's connections subscribed to at
// least one channel.
func pubsubClients(t *testing.T, raw *goredis.Client) []string {
	t.Helper()
	list, err := raw.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		var id string
		sub := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "sub="); ok && v != "0" {
				sub = true
			}
		}
		if sub {
			ids = append(ids, id)
		}
	}
	return ids
}

// Every call honours its ctx when the network path is black-holed.
func TestBlackholedCallsEndWithCtx(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	proxy := faultnet.ListenT(t, addr)
	l := newLocker(t, newClient(t, proxy.Addr()), &redis.Options{KeyPrefix: p})
	ls, err := l.TryAcquire(ctx, "b", &dlock.Options{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	for _, op := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error { _, err := l.TryAcquire(ctx, "b2", nil); return err }},
		{"Acquire", func(ctx context.Context) error { _, err := l.Acquire(ctx, "b3", nil); return err }},
		{"Held", func(ctx context.Context) error { _, err := ls.Held(ctx); return err }},
		{"Refresh", func(ctx context.Context) error { return ls.Refresh(ctx, 0) }},
	} {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		err := op.fn(cctx)
		cancel()
		if err == nil || time.Since(start) > 700*time.Millisecond {
			t.Errorf("%s while black-holed: %v after %v; want an error within the 200ms ctx", op.name, err, time.Since(start))
		}
	}
	proxy.Heal()
	// The watchdog may have refreshed it in time after the heal, or not.
	if err := ls.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release after the heal: %v", err)
	}
	waitGone(t, raw, p+"{b}")
}

// waitGone waits until key has expired on the server.
func waitGone(t *testing.T, raw *goredis.Client, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for raw.Exists(context.Background(), key).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not expire", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// New wraps the application's client: closing the Locker leaves it open.
func TestCloseKeepsClient(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newClient(t, redisAddr(t))
	l, err := redis.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("client unusable after the Locker closed: %v", err)
	}
	if _, err := redis.New(nil, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New(nil): %v, want ErrInvalid", err)
	}
	if _, err := redis.New(c, &redis.Options{Defaults: dlock.Options{TTL: time.Millisecond}}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New with a TTL below MinTTL: %v, want ErrInvalid", err)
	}
}

const secret = "s3cr3t-Pw0rd"

// Bad URLs fail with ErrInvalid before any I/O (the host is a closed port),
// and no error repeats the password.
func TestOpenInvalidURL(t *testing.T) {
	ctx := testutil.Ctx(t)
	dir := t.TempDir()
	garbage := dir + "/garbage.pem"
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "redis://user:" + secret + "@127.0.0.1:1"
	tlsBase := "rediss://user:" + secret + "@127.0.0.1:1"
	for _, u := range []string{
		base + "?ttl=soon",
		base + "?ttl=1ms",
		base + "?ttl=1s&refresh_interval=2s",
		base + "?compat=maybe",
		base + "?prefix=a&prefix=b",
		base + "?nonsense=1",
		base + "?pool_size=many",
		base + "/notadb",
		base + "/1/2",
		base + "?tls_ca=/etc/ssl/certs/ca-certificates.crt",
		base + "?%zz",
		tlsBase + "?tls_cert=" + garbage,
		tlsBase + "?tls_ca=" + dir + "/missing.pem",
		tlsBase + "?tls_ca=" + garbage,
		tlsBase + "?tls_cert=" + garbage + "&tls_key=" + garbage,
		tlsBase + "?tls_insecure_skip_verify=perhaps",
		"redis://user:" + secret + "@[::1",
	} {
		l, err := dlock.Open(ctx, u)
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("Open(%s) succeeded", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s): %v; want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): error %q contains the password", u, err)
		}
	}
}

// A comma-separated host list is a Redlock URL's: redis:// refuses it
// before any I/O (no DNS lookup of "h1:p1,h2"), naming redlock://.
func TestOpenHostList(t *testing.T) {
	for _, u := range []string{
		"redis://127.0.0.1:1,127.0.0.1:2",
		"redis://user:" + secret + "@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0",
		"rediss://a,b",
		"redis://a,",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		l, err := dlock.Open(ctx, u)
		elapsed := time.Since(start)
		cancel()
		if err == nil {
			_ = l.Close(context.Background())
			t.Errorf("Open(%s) succeeded", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "redlock://") || strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): %v; want ErrInvalid naming redlock://, without the password", u, err)
		}
		if elapsed >= 200*time.Millisecond {
			t.Errorf("Open(%s) took %v: I/O before refusing it", u, elapsed)
		}
	}
}

// Open reports an unreachable server, and a server that never answers
// within ctx, without the password and without ErrInvalid.
func TestOpenUnreachable(t *testing.T) {
	ctx := testutil.Ctx(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})

	u := "redis://user:" + secret + "@127.0.0.1:1"
	if _, err := dlock.Open(ctx, u); err == nil || errors.Is(err, dlock.ErrInvalid) || strings.Contains(err.Error(), secret) {
		t.Errorf("Open(closed port): %v; want a connection error without the password", err)
	}

	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = dlock.Open(cctx, "redis://user:"+secret+"@"+ln.Addr().String())
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), secret) {
		t.Errorf("Open(silent server): %v; want DeadlineExceeded without the password", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Open(silent server) took %v; want about its 300ms ctx", d)
	}
}

// Open works with URL options, and with an ACL user and password; a wrong
// password fails without being echoed.
func TestOpenACLUser(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	user, pass := "dlocktest-"+testutil.RandomHex(4), secret+testutil.RandomHex(4)
	if err := raw.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~"+p+"*", "&"+p+"*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Do(context.Background(), "ACL", "DELUSER", user) })

	// The user may touch only keys and channels under p: the whole layout
	// stays under the prefix.
	l, err := dlock.Open(ctx, fmt.Sprintf("redis://%s:%s@%s/0?prefix=%s&ttl=3s&dial_timeout=2s", user, pass, addr, p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ls, err := l.TryAcquire(ctx, "acl", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 3*time.Second {
		t.Errorf("TTL %v; want 3s from the URL", ls.TTL())
	}
	if ttl, _ := raw.PTTL(ctx, p+"{acl}").Result(); ttl <= 2*time.Second {
		t.Errorf("PTTL %v; want about 3s", ttl)
	}
	done := acquireAsync(ctx, l, "acl", nil) // subscribes as the ACL user
	waitSubscribers(t, raw, p+"{acl}:released", 1)
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	wrong := secret + "-wrong"
	_, err = dlock.Open(ctx, fmt.Sprintf("redis://%s:%s@%s", user, wrong, addr))
	if err == nil || strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), secret) {
		t.Errorf("Open with a wrong password: %v; want an error without the password", err)
	}
}

// An ACL user with rights on the keys but not on the channels can still
// take and release locks (the release script's PUBLISH fails quietly); its
// waiters cannot subscribe and fall back to polling, and still get the lock.
func TestACLUserWithoutChannels(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	user, pass := "dlocktest-"+testutil.RandomHex(4), secret+testutil.RandomHex(4)
	if err := raw.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~"+p+"*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Do(context.Background(), "ACL", "DELUSER", user) })
	l, err := dlock.Open(ctx, fmt.Sprintf("redis://%s:%s@%s?prefix=%s&retry_max=100ms", user, pass, addr, p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ls, err := l.TryAcquire(ctx, "acl", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, l, "acl", nil)
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatalf("Release without rights on the channel: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if lag := r.at.Sub(released); lag > time.Second {
		t.Errorf("waiter granted %v after the release; want within its 100ms retry_max polling", lag)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Open's compat parameter selects the compat layout.
func TestOpenCompat(t *testing.T) {
	ctx := testutil.Ctx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	l, err := dlock.Open(ctx, "redis://"+addr+"?compat=true&prefix="+p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if l.Capabilities().Fencing {
		t.Error("compat=true declares Fencing")
	}
	ls, err := l.TryAcquire(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := raw.Get(ctx, p+"c").Result(); v != ls.Token() {
		t.Errorf("GET %sc = %q; want the token", p, v)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSchemesRegistered(t *testing.T) {
	for _, s := range []string{"redis", "rediss"} {
		if !slices.Contains(dlockdriver.Schemes(), s) {
			t.Errorf("scheme %q not registered", s)
		}
	}
}
