package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// flakyReleaseDriver grants every TryAcquire; its handles' Release fails
// with errTransient for the first fails calls (all of them when fails < 0).
type flakyReleaseDriver struct {
	fails    int32
	releases atomic.Int32
}

var errTransient = errors.New("i/o timeout")

func (d *flakyReleaseDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *flakyReleaseDriver) Close() error                     { return nil }

func (d *flakyReleaseDriver) TryAcquire(context.Context, driver.Request) (*driver.Grant, error) {
	return &driver.Grant{Handle: flakyReleaseHandle{d}}, nil
}

type flakyReleaseHandle struct{ d *flakyReleaseDriver }

func (h flakyReleaseHandle) Refresh(context.Context, time.Duration) (time.Duration, error) {
	return 0, nil
}
func (h flakyReleaseHandle) Held(context.Context) (bool, error) { return true, nil }
func (h flakyReleaseHandle) Release(context.Context) error {
	n := h.d.releases.Add(1)
	if h.d.fails < 0 || n <= h.d.fails {
		return errTransient
	}
	return nil
}

// Close tries a failed release again: two timeouts, then the release goes
// through, and Close reports no error.
func TestCloseRetriesFailedRelease(t *testing.T) {
	d := &flakyReleaseDriver{fails: 2}
	l, err := dlock.New(d, &dlock.Options{NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(context.Background(), "x", &dlock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("Close = %v, want nil after the release went through on its third try", err)
	}
	if got := d.releases.Load(); got != 3 {
		t.Errorf("Release was called %d times, want 3", got)
	}
	if !errors.Is(ls.Err(), dlock.ErrReleased) {
		t.Errorf("the lease's Err() = %v, want ErrReleased", ls.Err())
	}
}

// A release that keeps failing is tried until Close's ctx ends, and Close
// then returns its error.
func TestCloseGivesUpAtCtx(t *testing.T) {
	d := &flakyReleaseDriver{fails: -1}
	l, err := dlock.New(d, &dlock.Options{NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(context.Background(), "x", &dlock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = l.Close(ctx)
	if !errors.Is(err, errTransient) {
		t.Fatalf("Close = %v, want the release's error", err)
	}
	if ctx.Err() == nil {
		t.Error("Close returned before its ctx ended, with the lease valid for a minute")
	}
	if got := d.releases.Load(); got < 2 {
		t.Errorf("Release was called %d times, want it tried again", got)
	}
	if !errors.Is(ls.Err(), dlock.ErrLost) {
		t.Errorf("the lease's Err() = %v, want ErrLost (ended by Close)", ls.Err())
	}
}

// A lease about to expire is not retried past its validity.
func TestCloseStopsRetryingAtValidUntil(t *testing.T) {
	d := &flakyReleaseDriver{fails: -1}
	l, err := dlock.New(d, &dlock.Options{NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(context.Background(), "x", &dlock.Options{TTL: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Close(context.Background())
	if !errors.Is(err, errTransient) {
		t.Fatalf("Close = %v, want the release's error", err)
	}
	if now := time.Now(); now.After(ls.ValidUntil().Add(time.Second)) {
		t.Errorf("Close returned %v after the lease's ValidUntil: it kept trying past it", now.Sub(ls.ValidUntil()))
	}
}

// hungDriver stands for a backend that stopped answering: TryAcquire and
// Abandon wait until back is closed (or their ctx ends); Close reports
// that it ran by closing closed.
type hungDriver struct {
	back, closed chan struct{}
	abandoned    atomic.Int32
}

func (d *hungDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }

func (d *hungDriver) TryAcquire(ctx context.Context, _ driver.Request) (*driver.Grant, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (d *hungDriver) Abandon(ctx context.Context, _ driver.Request) error {
	select {
	case <-d.back:
		d.abandoned.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *hungDriver) Close() error {
	close(d.closed)
	return nil
}

// Close returns by its ctx's deadline though an attempt's clean-up hangs
// for the attempt's TTL, says what it left, and the clean-up finishes in
// the background, the driver's Close after it.
func TestCloseReturnsByCtxWithCleanupHung(t *testing.T) {
	d := &hungDriver{back: make(chan struct{}), closed: make(chan struct{})}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	_, err = l.TryAcquire(actx, "x", &dlock.Options{TTL: time.Minute})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire = %v, want it cut short by its ctx", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Close(ctx)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close with a 200ms ctx took %v", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want an error matching its ctx's", err)
	}
	for _, want := range []string{"1 attempt's clean-up abandoned", "closing the driver abandoned"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Close = %v, want it to say %q", err, want)
		}
	}
	select {
	case <-d.closed:
		t.Fatal("the driver was closed while an attempt's clean-up still ran")
	default:
	}
	close(d.back) // the backend answers again
	<-d.closed
	if d.abandoned.Load() != 1 {
		t.Errorf("the attempt's clean-up ran %d times once the backend answered, want 1", d.abandoned.Load())
	}
	if err := l.Close(context.Background()); err != nil {
		t.Errorf("a second Close = %v, want nil", err)
	}
}
