package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// lossDriver grants every TryAcquire; its handles report loss through
// driver.LossNotifier. With early set, a handle is lost before the
// Locker registers with it.
type lossDriver struct {
	early   bool
	handles chan *lossHandle
}

func (d *lossDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *lossDriver) Close() error                     { return nil }

func (d *lossDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	h := &lossHandle{}
	if d.early {
		h.drop()
	}
	d.handles <- h
	return &driver.Grant{Handle: h}, nil
}

type lossHandle struct {
	released   atomic.Bool
	mu         sync.Mutex
	lost       bool
	onLost     func()
	registered bool
}

func (h *lossHandle) Refresh(context.Context, time.Duration) (time.Duration, error) { return 0, nil }
func (h *lossHandle) Release(context.Context) error                                 { h.released.Store(true); return nil }
func (h *lossHandle) Held(context.Context) (bool, error)                            { return true, nil }

// OnLost implements driver.LossNotifier.
func (h *lossHandle) OnLost(f func()) {
	h.mu.Lock()
	h.registered = true
	if h.lost {
		h.mu.Unlock()
		f()
		return
	}
	h.onLost = f
	h.mu.Unlock()
}

// drop is the backend losing the lock.
func (h *lossHandle) drop() {
	h.mu.Lock()
	h.lost = true
	f := h.onLost
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

// A loss the driver reports through LossNotifier ends the lease with
// ErrLost, whether it happens after the Locker registered or before.
func TestDriverReportedLoss(t *testing.T) {
	for _, early := range []bool{false, true} {
		d := &lossDriver{early: early, handles: make(chan *lossHandle, 1)}
		l, err := dlock.New(d, &dlock.Options{NoRefresh: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		ls, err := l.TryAcquire(ctx, "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		h := <-d.handles
		h.mu.Lock()
		registered := h.registered
		h.mu.Unlock()
		if !registered {
			t.Errorf("early=%v: the Locker did not register with LossNotifier", early)
		}
		h.drop()
		select {
		case <-ls.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("early=%v: the lease did not end after the driver reported loss", early)
		}
		if !errors.Is(ls.Err(), dlock.ErrLost) {
			t.Errorf("early=%v: Err() = %v, want ErrLost", early, ls.Err())
		}
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}
}

// A loss the backend reports after the watchdog stopped for MaxHold is
// attributed to MaxHold: Err matches ErrLost and ErrMaxHold, whoever
// reported the loss first (postgres ends a silent holder's session itself,
// which on a loaded machine can come before the ValidUntil timer runs).
func TestDriverReportedLossAfterMaxHold(t *testing.T) {
	d := &lossDriver{handles: make(chan *lossHandle, 1)}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer l.Close(ctx)
	// The watchdog refreshes every 300ms and stops at its first tick past
	// MaxHold (3-3.3s); ValidUntil is then 5.7-6s. The loss comes at 4.5s,
	// more than a second from either end (MaxHold cannot be below the TTL).
	ls, err := l.TryAcquire(ctx, "x", &dlock.Options{TTL: 3 * time.Second, RefreshInterval: 300 * time.Millisecond, MaxHold: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := <-d.handles
	time.Sleep(4500 * time.Millisecond)
	if ls.Err() != nil {
		t.Fatalf("the lease ended before its ValidUntil: %v", ls.Err())
	}
	h.drop()
	select {
	case <-ls.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end after the driver reported loss")
	}
	if err := ls.Err(); !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrMaxHold) {
		t.Errorf("Err() = %v, want ErrLost and ErrMaxHold", err)
	}
}
