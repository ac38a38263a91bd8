package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// lossDriver grants every TryAcquire; its handles report loss through
// Grant.Lost, and, when callback is set, through driver.LossNotifier too.
type lossDriver struct {
	callback bool
	handles  chan *lossHandle
}

func (d *lossDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *lossDriver) Close() error                     { return nil }

func (d *lossDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	h := &lossHandle{lost: make(chan struct{})}
	d.handles <- h
	var handle driver.Handle = h
	if d.callback {
		handle = &notifyingHandle{h}
	}
	return &driver.Grant{Handle: handle, Lost: h.lost}, nil
}

type lossHandle struct {
	lost   chan struct{}
	onLost func()
}

func (h *lossHandle) Refresh(context.Context, time.Duration) (time.Duration, error) { return 0, nil }
func (h *lossHandle) Release(context.Context) error                                 { return nil }
func (h *lossHandle) Held(context.Context) (bool, error)                            { return true, nil }

// drop is the backend losing the lock.
func (h *lossHandle) drop() {
	close(h.lost)
	if h.onLost != nil {
		h.onLost()
	}
}

type notifyingHandle struct{ *lossHandle }

func (h *notifyingHandle) OnLost(f func()) { h.onLost = f }

// A loss the driver reports ends the lease with ErrLost, whether through the
// Lost channel (watched by the Locker) or through LossNotifier (no watcher).
func TestDriverReportedLoss(t *testing.T) {
	for _, callback := range []bool{false, true} {
		d := &lossDriver{callback: callback, handles: make(chan *lossHandle, 1)}
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
		if callback && h.onLost == nil {
			t.Error("the Locker did not register with LossNotifier")
		}
		h.drop()
		select {
		case <-ls.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("callback=%v: the lease did not end after the driver reported loss", callback)
		}
		if !errors.Is(ls.Err(), dlock.ErrLost) {
			t.Errorf("callback=%v: Err() = %v, want ErrLost", callback, ls.Err())
		}
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}
}
