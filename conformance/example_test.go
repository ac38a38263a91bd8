package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/driver"
)

// This file is a complete third-party driver, written against package driver
// alone, and the harness that runs the suite on it. Its "server" is a map in
// the process; a real driver talks to its backend instead, and its harness
// routes each Locker's client through a faultnet.Proxy.

// toyServer is the lock service: one map of locks and one fence counter.
type toyServer struct {
	mu    sync.Mutex
	locks map[string]toyLock
	fence uint64
}

type toyLock struct {
	token   string
	expires time.Time
}

func newToyServer() *toyServer { return &toyServer{locks: map[string]toyLock{}} }

// live returns name's lock unless it has expired; mu held.
func (s *toyServer) live(name string) (toyLock, bool) {
	l, ok := s.locks[name]
	if ok && !time.Now().Before(l.expires) {
		delete(s.locks, name)
		return toyLock{}, false
	}
	return l, ok
}

// toyDriver implements driver.Driver (TryAcquire, Capabilities, Close) and
// driver.Abandoner.
// The Locker built around it does the waiting (polling), the watchdog,
// validity, validation and loss signalling.
type toyDriver struct {
	srv *toyServer
	net *toyNet
}

func (d *toyDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Fencing: true, MinTTL: 10 * time.Millisecond}
}

func (d *toyDriver) Close() error { return nil }

func (d *toyDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	var fence uint64
	err := d.net.call(ctx, func() error {
		s := d.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		if l, ok := s.live(req.Name); ok {
			return driver.Busy(time.Until(l.expires))
		}
		s.fence++
		fence = s.fence
		s.locks[req.Name] = toyLock{token: req.Token, expires: time.Now().Add(req.TTL)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &driver.Grant{Handle: &toyHandle{d: d, name: req.Name, token: req.Token}, Fence: fence}, nil
}

// Abandon implements driver.Abandoner: a TryAcquire whose reply was lost, or
// whose ctx ended after the request left, may have taken the lock all the
// same; the Locker calls Abandon to remove it if req.Token holds it.
func (d *toyDriver) Abandon(ctx context.Context, req driver.Request) error {
	err := (&toyHandle{d: d, name: req.Name, token: req.Token}).Release(ctx)
	if errors.Is(err, driver.ErrNotHeld) {
		return nil
	}
	return err
}

// toyHandle implements driver.Handle: every operation checks that the lock
// is still this lease's token, so that nothing touches a newer holder's lock.
type toyHandle struct {
	d           *toyDriver
	name, token string
}

// mine runs f on the lock if it is still this handle's, else returns
// driver.ErrNotHeld.
func (h *toyHandle) mine(ctx context.Context, f func(s *toyServer)) error {
	return h.d.net.call(ctx, func() error {
		s := h.d.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		if l, ok := s.live(h.name); !ok || l.token != h.token {
			return driver.ErrNotHeld
		}
		f(s)
		return nil
	})
}

func (h *toyHandle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	return 0, h.mine(ctx, func(s *toyServer) {
		s.locks[h.name] = toyLock{token: h.token, expires: time.Now().Add(ttl)}
	})
}

func (h *toyHandle) Release(ctx context.Context) error {
	return h.mine(ctx, func(s *toyServer) { delete(s.locks, h.name) })
}

func (h *toyHandle) Held(ctx context.Context) (bool, error) {
	err := h.mine(ctx, func(*toyServer) {})
	if errors.Is(err, driver.ErrNotHeld) {
		return false, nil
	}
	return err == nil, err
}

// toyNet stands for one Locker's network path and implements
// conformance.Faults: a black-holed call is lost (it waits for its ctx), a
// reset fails the calls in flight, latency delays each call both ways.
type toyNet struct {
	mu      sync.Mutex
	hole    chan struct{} // closed on Heal; nil when healthy
	reset   chan struct{} // closed on Reset, then replaced
	latency time.Duration
}

var errReset = errors.New("toy: connection reset")

func newToyNet() *toyNet { return &toyNet{reset: make(chan struct{})} }

func (n *toyNet) call(ctx context.Context, f func() error) error {
	n.mu.Lock()
	hole, reset, latency := n.hole, n.reset, n.latency
	n.mu.Unlock()
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-reset:
			return errReset
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if hole != nil { // the request is lost
		select {
		case <-reset:
			return errReset
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := wait(latency); err != nil {
		return err
	}
	if err := f(); err != nil {
		return err
	}
	return wait(latency)
}

func (n *toyNet) Blackhole() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hole == nil {
		n.hole = make(chan struct{})
	}
}

func (n *toyNet) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hole = nil
}

func (n *toyNet) Reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	close(n.reset)
	n.reset = make(chan struct{})
}

func (n *toyNet) SetLatency(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.latency = d
}

// toyHarness connects the suite to the toy backend: independent Lockers on
// one server, each with its own network path, and what the server still
// stores for a name.
type toyHarness struct{ srv *toyServer }

func (h toyHarness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	net := newToyNet()
	l, err := dlock.New(&toyDriver{srv: h.srv, net: net}, defaults)
	if err != nil {
		t.Fatal(err)
	}
	return l, net
}

func (h toyHarness) Residue(_ context.Context, name string) ([]string, error) {
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	if l, ok := h.srv.live(name); ok {
		return []string{fmt.Sprintf("lock %q held by %s", name, l.token)}, nil
	}
	return nil, nil
}

// TestToyDriver proves that a driver written against package driver alone
// passes the suite.
func TestToyDriver(t *testing.T) {
	conformance.RunConfig(t, toyHarness{newToyServer()}, conformance.Config{TTL: 300 * time.Millisecond})
}

// A third-party driver is used like any other: dlock.New builds the Locker
// around it. Its TestConformance is TestToyDriver above.
func Example() {
	ctx := context.Background()
	srv := newToyServer()
	locker, err := dlock.New(&toyDriver{srv: srv, net: newToyNet()}, &dlock.Options{TTL: time.Second})
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	lease, err := locker.Acquire(ctx, "report", nil)
	if err != nil {
		panic(err)
	}
	fence, _ := lease.Fence()
	_, busy := locker.TryAcquire(ctx, "report", nil)
	fmt.Println(fence, errors.Is(busy, dlock.ErrNotAcquired), lease.Release(ctx))
	// Output: 1 true <nil>
}
