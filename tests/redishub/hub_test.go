package redishub_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/redishub"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	goredis "github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// routeGrant is the redis driver's routing: "g:<key>:<anything>" is for the
// waiter of key.
func routeGrant(payload string) (string, bool) {
	rest, ok := strings.CutPrefix(payload, "g:")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i < 0 {
		return "", false
	}
	return rest[:i], true
}

func newHub(t *testing.T, addr string, confirm time.Duration) *hub {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: confirm})
	h := &hub{redishub.New(c, "redis", routeGrant)}
	h.SetLinger(0) // tests of subscription mechanics; TestLinger sets it
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("hub close: %v", err)
		}
		_ = c.Close()
	})
	return h
}

// hub adds the tests' helpers to a redishub.Hub.
type hub struct{ *redishub.Hub }

// watch is a plain watch that signals a 1-buffered channel, as the
// drivers' waiters do.
func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	x, err := h.Watch(ctx, channel, "", func(string, bool) { redishub.Signal(c) })
	if err != nil {
		return nil, nil, err
	}
	return c, x.Stop, nil
}

// keyed is a watch with a key that records the last payload it was given.
type keyed struct {
	x    *redishub.Watcher
	c    chan struct{}
	mu   sync.Mutex
	last string
}

func (k *keyed) payload() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}

func (h *hub) watchKey(ctx context.Context, channel, key string) (*keyed, error) {
	k := &keyed{c: make(chan struct{}, 1)}
	x, err := h.Watch(ctx, channel, key, func(p string, message bool) {
		if message {
			k.mu.Lock()
			k.last = p
			k.mu.Unlock()
		}
		redishub.Signal(k.c)
	})
	k.x = x
	return k, err
}

func numSub(t *testing.T, raw *goredis.Client, channel string) int64 {
	t.Helper()
	m, err := raw.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

// When Watch returns, the server has the subscription, however a watch that
// gave up early (subscribe, then unsubscribe in flight) interleaves with it;
// once nobody watches, the channel is unsubscribed and its state dropped.
func TestWatchReadyMeansSubscribed(t *testing.T) {
	addr := servers.Require(t, servers.Redis).Addr()
	raw := goredis.NewClient(&goredis.Options{Addr: addr})
	defer raw.Close()
	h := newHub(t, addr, 3*time.Second)
	channel := "dlocktest:hub:" + time.Now().Format("150405.000000")
	ctx := context.Background()
	for i := range 200 {
		// A watch cut short at a random point: before, during or after its
		// confirmation.
		short, cancel := context.WithTimeout(ctx, time.Duration(rand.N(1500))*time.Microsecond)
		if _, stop, err := h.watch(short, channel); err == nil {
			stop()
		}
		cancel()
		if i%3 == 0 {
			time.Sleep(time.Duration(rand.N(500)) * time.Microsecond)
		}
		_, stop, err := h.watch(ctx, channel)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if n := numSub(t, raw, channel); n != 1 {
			t.Fatalf("round %d: Watch returned with %d subscriptions on the server, want 1", i, n)
		}
		stop()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := h.Stats().Channels
		if left == 0 && numSub(t, raw, channel) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channel states and %d server subscriptions left after every watch stopped", left, numSub(t, raw, channel))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A watch that gives up before its SUBSCRIBE is confirmed leaves an
// UNSUBSCRIBE in flight; a new watch of the same channel sends SUBSCRIBE
// again and must wait for that second confirmation, not take the first one
// for its own. With 20ms of latency each way: SUBSCRIBE at 0, UNSUBSCRIBE at
// 5ms, SUBSCRIBE at 30ms; the first confirmation arrives at 40ms, when the
// server has processed the UNSUBSCRIBE but not yet the second SUBSCRIBE.
func TestWatchWaitsForItsOwnConfirmation(t *testing.T) {
	addr := servers.Require(t, servers.Redis).Addr()
	raw := goredis.NewClient(&goredis.Options{Addr: addr})
	defer raw.Close()
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	h := newHub(t, proxy.Addr(), 3*time.Second)
	ctx := context.Background()
	prefix := "dlocktest:hub:" + time.Now().Format("150405.000000") + ":"
	_, stopWarm, err := h.watch(ctx, prefix+"warm") // the connection is up
	if err != nil {
		t.Fatal(err)
	}
	defer stopWarm()
	const lag = 20 * time.Millisecond
	proxy.SetLatency(lag)
	for i := range 5 {
		channel := prefix + string(rune('a'+i))
		start := time.Now()
		short, cancel := context.WithTimeout(ctx, lag/4)
		if _, stop, err := h.watch(short, channel); err == nil {
			stop()
			t.Fatal("a watch was confirmed within a quarter of the one-way latency")
		}
		cancel()
		time.Sleep(time.Until(start.Add(lag * 3 / 2)))
		_, stop, err := h.watch(ctx, channel)
		if err != nil {
			t.Fatal(err)
		}
		if n := numSub(t, raw, channel); n != 1 {
			t.Fatalf("round %d: Watch returned %v after the first SUBSCRIBE with %d subscriptions on the server, want 1", i, time.Since(start), n)
		}
		stop()
	}
}

// A pub/sub connection that goes silent (black-holed, never reset) is
// detected: a Watch waiting for its confirmation fails within the confirm
// timeout plus one read wake-up, instead of waiting out its ctx, and the
// existing waiters are woken. After the heal, watching works again.
func TestWatchFailsOnSilentConnection(t *testing.T) {
	addr := servers.Require(t, servers.Redis).Addr()
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const confirm = 300 * time.Millisecond
	h := newHub(t, proxy.Addr(), confirm)
	ctx := context.Background()
	prefix := "dlocktest:hub:" + time.Now().Format("150405.000000") + ":"
	c, stop, err := h.watch(ctx, prefix+"a")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	proxy.Blackhole()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err = h.watch(wctx, prefix+"b")
	took := time.Since(start)
	if err == nil || wctx.Err() != nil {
		t.Fatalf("Watch over a silent connection: %v after %v; want a connection error before its ctx ends", err, took)
	}
	if limit := confirm + redishub.ReadWake + time.Second; took > limit {
		t.Errorf("Watch failed after %v; want within %v", took, limit)
	}
	select {
	case <-c:
	default:
		t.Error("the existing waiter was not woken when the connection was given up")
	}

	proxy.Heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, stop, err := h.watch(wctx, prefix+"b")
		cancel()
		if err == nil {
			stop()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Watch still failing 10s after the heal: %v", err)
		}
	}
}

// A connection that goes silent while waiters only wait (no command in
// flight) is pinged after pingIdle; when the PING is not answered within the
// confirm timeout the connection is replaced and the waiters are woken, and
// once it answers again they are woken again after the resubscription.
func TestSilentConnectionPinged(t *testing.T) {
	const pingIdle = 200 * time.Millisecond
	addr := servers.Require(t, servers.Redis).Addr()
	raw := goredis.NewClient(&goredis.Options{Addr: addr})
	defer raw.Close()
	proxy, err := faultnet.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const confirm = 300 * time.Millisecond
	h := newHub(t, proxy.Addr(), confirm)
	h.SetPingIdle(pingIdle)
	channel := "dlocktest:hub:" + time.Now().Format("150405.000000")
	c, stop, err := h.watch(context.Background(), channel)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// Healthy: pings are answered and nothing is woken.
	select {
	case <-c:
		t.Fatal("woken on a healthy connection")
	case <-time.After(2*redishub.ReadWake + pingIdle):
	}
	st := h.Stats()
	heard, epoch := time.Since(st.LastHeard), st.Epoch
	if heard > redishub.ReadWake+pingIdle || epoch != 0 {
		t.Fatalf("last reply %v ago, epoch %d; want pongs within %v on epoch 0", heard, epoch, redishub.ReadWake+pingIdle)
	}

	proxy.Blackhole()
	start := time.Now()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken 10s into a silent partition")
	}
	if took, limit := time.Since(start), pingIdle+confirm+2*redishub.ReadWake; took > limit {
		t.Errorf("woken %v into the partition; want within %v", took, limit)
	}
	// Wakes keep coming while reconnecting fails in the partition; after the
	// heal one must come once the channel is subscribed again.
	proxy.Heal()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-c:
		case <-deadline:
			t.Fatal("waiter not woken after its resubscription, 10s after the heal")
		}
		if h.Ready(channel) {
			return
		}
	}
}

// Messages that Route gives a key reach only the waiter watching with that
// key; other messages reach every waiter of the channel.
func TestGrantRouting(t *testing.T) {
	addr := servers.Require(t, servers.Redis).Addr()
	raw := goredis.NewClient(&goredis.Options{Addr: addr})
	defer raw.Close()
	h := newHub(t, addr, 3*time.Second)
	ctx := context.Background()
	channel := "dlocktest:hub:" + time.Now().Format("150405.000000")
	a, err := h.watchKey(ctx, channel, "aaaa")
	if err != nil {
		t.Fatal(err)
	}
	defer a.x.Stop()
	b, err := h.watchKey(ctx, channel, "bbbb")
	if err != nil {
		t.Fatal(err)
	}
	defer b.x.Stop()
	plain, stop, err := h.watch(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	raw.Publish(ctx, channel, "g:aaaa:5")
	select {
	case <-a.c:
	case <-time.After(5 * time.Second):
		t.Fatal("the grant did not reach its waiter")
	}
	if p := a.payload(); p != "g:aaaa:5" {
		t.Errorf("the grant's waiter got %q", p)
	}
	// The message was handled whole when a was signalled.
	select {
	case <-b.c:
		t.Error("a grant to another token woke a waiter")
	case <-plain:
		t.Error("a grant woke a plain watch")
	default:
	}
	raw.Publish(ctx, channel, "")
	// The hub signals the waiters one after another: each may see its
	// signal before the next one is given.
	for _, c := range []<-chan struct{}{b.c, a.c, plain} {
		select {
		case <-c:
		case <-time.After(5 * time.Second):
			t.Fatal("a plain message did not wake every waiter and the plain watch")
		}
	}
	if p := b.payload(); p != "" {
		t.Errorf("the other waiter got %q", p)
	}
}

// A channel stays subscribed for the linger time after its last waiter
// left, so that watching it again costs no SUBSCRIBE; then it is dropped.
func TestLinger(t *testing.T) {
	addr := servers.Require(t, servers.Redis).Addr()
	raw := goredis.NewClient(&goredis.Options{Addr: addr})
	defer raw.Close()
	h := newHub(t, addr, 3*time.Second)
	h.SetLinger(300 * time.Millisecond)
	ctx := context.Background()
	channel := "dlocktest:hub:" + time.Now().Format("150405.000000")
	_, stop, err := h.watch(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !h.Ready(channel) {
		t.Fatal("the channel was not kept after its last waiter left")
	}
	outstanding := h.Stats().Outstanding
	for range 10 {
		_, stop, err := h.watch(ctx, channel)
		if err != nil {
			t.Fatal(err)
		}
		stop()
	}
	if st := h.Stats(); st.Outstanding != outstanding || st.Lingering != 1 {
		t.Errorf("watching a lingering channel sent commands (%d outstanding, was %d) or lingering = %d, want 1", st.Outstanding, outstanding, st.Lingering)
	}
	if n := numSub(t, raw, channel); n != 1 {
		t.Fatalf("%d subscriptions while lingering, want 1", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := h.Stats()
		left, lingering := st.Channels, st.Lingering
		if left == 0 && lingering == 0 && numSub(t, raw, channel) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channels (%d lingering) and %d subscriptions 5s after a 300ms linger", left, lingering, numSub(t, raw, channel))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
