package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
)

// A refresh that reaches the server just after its lease was declared lost
// (the holder's connection froze and heals as the loss is reported) does
// not keep the lock for another TTL: a waiter is granted within a short
// bound of the lost lease's ValidUntil (issue 29, item 9).
func TestRefreshAfterDeclaredLossDoesNotExtend(t *testing.T) {
	const ttl = 5 * time.Second
	h := harness{addr: redisAddr(t)}
	a, fa := h.NewLocker(t, &dlock.Options{TTL: ttl, NoRefresh: true})
	b, _ := h.NewLocker(t, &dlock.Options{TTL: ttl})
	for _, l := range []*dlock.Locker{a, b} {
		t.Cleanup(func() { _ = l.Close(context.Background()) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	name := "dlock-test/late-refresh/" + hex.EncodeToString(rb[:])
	for _, l := range []*dlock.Locker{a, b} { // warm: connections dialled
		ls, err := l.Acquire(ctx, name+"/warm", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := a.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ls  *dlock.Lease
		at  time.Time
		err error
	}
	waited := make(chan result, 1)
	go func() {
		lb, err := b.Acquire(ctx, name, nil)
		waited <- result{lb, time.Now(), err}
	}()

	// The refresh is held up on the holder's path until just past its
	// ValidUntil: the server receives it after the Locker declared the
	// lease lost, while the key, whose TTL runs from when the server saw
	// the acquisition, still holds the lease's token (the drift margin,
	// TTL/100 + 2ms, is that window; the refresh aims at its middle).
	// Only the refresh is delayed: once it is inside the proxy, the
	// latency goes back to 0, so that the release the Locker sends when it
	// declares the loss is not held up too. (Healing when Done closed
	// raced with that release: read by the proxy first, it took the
	// refresh's 5s delay and the waiter was granted 4.99s late.)
	p := fa.(*faultnet.Proxy)
	vu := ls.ValidUntil()
	window := ttl/100 + 2*time.Millisecond
	before := p.Sent()
	p.SetLatency(time.Until(vu) + window/2)
	refreshed := make(chan error, 1)
	go func() { refreshed <- ls.Refresh(ctx, 0) }()
	for end := time.Now().Add(5 * time.Second); p.Sent() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the refresh did not reach the proxy within 5s")
		}
	}
	p.SetLatency(0)
	<-ls.Done()
	if !errors.Is(ls.Err(), dlock.ErrLost) {
		t.Fatalf("the lease ended with %v, want ErrLost", ls.Err())
	}

	r := <-waited
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	defer func() { _ = r.ls.Release(ctx) }()
	bound, err := conformance.Live(conformance.DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	late := r.at.Sub(vu)
	t.Logf("the waiter was granted %v after the lost lease's ValidUntil", late.Round(time.Millisecond))
	if late > bound {
		t.Errorf("the waiter was granted %v after the lost lease's ValidUntil, want within %v: the late refresh extended the lost lease", late.Round(time.Millisecond), bound)
	}
	if err := <-refreshed; err == nil {
		t.Errorf("the refresh sent before the loss and received after it returned nil")
	}
}
