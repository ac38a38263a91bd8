package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memory"
)

// Bad input to AcquireAll fails with ErrInvalid before the driver is asked
// anything.
func TestAcquireAllInvalid(t *testing.T) {
	d := &lossDriver{handles: make(chan *lossHandle, 1)}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	many := make([]string, dlock.MaxAcquireAll+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	for _, tc := range []struct {
		why   string
		ctx   context.Context
		names []string
	}{
		{"nil ctx", nil, []string{"a", "b"}},
		{"no names", context.Background(), nil},
		{"a name twice", context.Background(), []string{"a", "b", "a"}},
		{"an empty name", context.Background(), []string{"a", ""}},
		{"too many names", context.Background(), many},
	} {
		if _, err := l.AcquireAll(tc.ctx, tc.names, nil); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("AcquireAll with %s: %v; want ErrInvalid", tc.why, err)
		}
		if _, err := l.TryAcquireAll(tc.ctx, tc.names, nil); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("TryAcquireAll with %s: %v; want ErrInvalid", tc.why, err)
		}
	}
	if len(d.handles) > 0 {
		t.Error("the driver was asked for a lock")
	}
}

// When the backend reports one name of an AcquireAll lease gone, the whole
// lease ends with ErrLost naming it, and the other names are given back.
func TestAcquireAllPartLostEndsAll(t *testing.T) {
	d := &lossDriver{handles: make(chan *lossHandle, 3)}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer l.Close(ctx)
	ls, err := l.AcquireAll(ctx, []string{"c", "a", "b"}, &dlock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := <-d.handles, <-d.handles, <-d.handles // taken in sorted order
	b.drop()
	select {
	case <-ls.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end when one of its names was lost")
	}
	if err := ls.Err(); !errors.Is(err, dlock.ErrLost) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("Err() = %v; want ErrLost naming \"b\"", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !a.released.Load() || !c.released.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("names still held after the lease was lost: a released %v, c released %v", a.released.Load(), c.released.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Release after the loss: %v; want ErrLost", err)
	}
}

// The watchdog refreshes every name of an AcquireAll lease: after many TTLs
// each is still the lease's; Close releases them all.
func TestAcquireAllRefreshedAndClosed(t *testing.T) {
	s := memory.NewStore()
	a, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ctx := context.Background()
	names := []string{"x", "y", "z"}
	ls, err := a.AcquireAll(ctx, names, &dlock.Options{TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]string{}
	for _, n := range names {
		first[n], _, _ = s.Holder(n)
	}
	time.Sleep(500 * time.Millisecond)
	if ls.Err() != nil {
		t.Fatalf("lease ended: %v", ls.Err())
	}
	for _, n := range names {
		if tok, _, ok := s.Holder(n); !ok || tok != first[n] {
			t.Errorf("%q after 10 TTLs: held %v by %q; want its first holder %q", n, ok, tok, first[n])
		}
		if _, err := b.TryAcquire(ctx, n, nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryAcquire(%q): %v; want ErrNotAcquired", n, err)
		}
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(ls.Err(), dlock.ErrNotHeld) {
		t.Errorf("Err after Close = %v", ls.Err())
	}
	for _, n := range names {
		if _, _, ok := s.Holder(n); ok {
			t.Errorf("%q still held after Close", n)
		}
	}
}

// A watchdog refresh of an AcquireAll lease that fails (a connection reset)
// is tried again, alone: on a driver that batches refreshes (memory does),
// the retry must not join a batch of single leases, whose requests the
// driver builds from its own handles (redlock panicked on one).
func TestAcquireAllRefreshRetried(t *testing.T) {
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer l.Close(ctx)
	failed := make(chan struct{}, 1)
	l.SetObserver(dlock.Observer{Hook: func(ev dlock.Event) {
		if ev.Kind == dlock.EventRefreshFailed {
			select {
			case failed <- struct{}{}:
			default:
			}
		}
	}})
	// A single lease beside it, so that batches exist.
	single, err := l.Acquire(ctx, "single", &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.AcquireAll(ctx, []string{"p", "q"}, &dlock.Options{TTL: 3 * time.Second, RefreshInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	link.Blackhole()
	time.Sleep(200 * time.Millisecond) // a refresh is hanging by now
	link.Heal()                        // it fails with ErrLinkReset
	select {
	case <-failed:
	case <-time.After(5 * time.Second):
		t.Fatal("no refresh failed")
	}
	for range 3 { // the retry and two more rounds
		<-time.After(150 * time.Millisecond)
		if ok, err := ls.Held(ctx); !ok || err != nil {
			t.Fatalf("Held after a failed refresh = %v, %v", ok, err)
		}
	}
	if vu := time.Until(ls.ValidUntil()); vu < 2*time.Second {
		t.Errorf("ValidUntil %v away: the watchdog did not refresh after the failure", vu)
	}
	_ = single.Release(ctx)
	_ = ls.Release(ctx)
}

// overlapDriver grants every TryAcquire; its handles record a Release or
// Held that runs while a Refresh of the same handle is still running, which
// a driver need not allow (postgres runs both on one connection). With
// hang set, Refresh waits for its ctx to end and then a little more, as a
// driver still reading its connection does.
type overlapDriver struct {
	hang    atomic.Bool
	overlap atomic.Bool
	handles []*overlapHandle // in grant order; AcquireAll's are sequential
}

func (d *overlapDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{} }
func (d *overlapDriver) Close() error                     { return nil }
func (d *overlapDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	h := &overlapHandle{d: d, lost: make(chan func(), 1)}
	d.handles = append(d.handles, h)
	return &driver.Grant{Handle: h}, nil
}

type overlapHandle struct {
	d        *overlapDriver
	inflight atomic.Int32
	lost     chan func()
}

// OnLost implements driver.LossNotifier; the test calls the function.
func (h *overlapHandle) OnLost(f func()) { h.lost <- f }

func (h *overlapHandle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	if h.d.hang.Load() {
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond)
		return 0, ctx.Err()
	}
	return ttl, nil
}

func (h *overlapHandle) Release(context.Context) error {
	if h.inflight.Load() > 0 {
		h.d.overlap.Store(true)
	}
	return nil
}

func (h *overlapHandle) Held(context.Context) (bool, error) { return true, nil }

// When one name of an AcquireAll lease is lost while the watchdog's refresh
// of them all hangs, the others are given back only after that refresh
// returned: no part's Release overlaps its Refresh (busy run 15: a data
// race on a postgres connection).
func TestAcquireAllGiveBackAfterRefresh(t *testing.T) {
	d := &overlapDriver{}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer l.Close(ctx)
	ls, err := l.AcquireAll(ctx, []string{"a", "b", "c"}, &dlock.Options{TTL: time.Minute, RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := d.handles[0]
	d.hang.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for a.inflight.Load() == 0 { // the watchdog's refresh is on its way
		if time.Now().After(deadline) {
			t.Fatal("no refresh started")
		}
		time.Sleep(time.Millisecond)
	}
	(<-a.lost)() // the backend reports "a" gone
	select {
	case <-ls.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end when a name was lost")
	}
	if err := l.Close(ctx); err != nil { // waits for the give-back
		t.Fatal(err)
	}
	if d.overlap.Load() {
		t.Error("a part was released while its refresh was still running")
	}
}

// multiDriver grants every TryAcquire, and takes several names in one
// TryAcquireAll call as told by answer: nil grants them all.
type multiDriver struct {
	lossDriver
	singles, multis atomic.Int32
	answer          error
}

func (d *multiDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	d.singles.Add(1)
	return &driver.Grant{Handle: &lossHandle{}}, nil
}

func (d *multiDriver) TryAcquireAll(ctx context.Context, reqs []driver.Request) ([]*driver.Grant, error) {
	d.multis.Add(1)
	if d.answer != nil {
		return nil, d.answer
	}
	gs := make([]*driver.Grant, len(reqs))
	for i := range gs {
		gs[i] = &driver.Grant{Handle: &lossHandle{}}
	}
	return gs, nil
}

// A driver.MultiAcquirer takes AcquireAll's names in one request; when
// they are busy TryAcquireAll fails at once and AcquireAll waits name by
// name; when it declines (ErrUnsupported) both go name by name.
func TestAcquireAllMultiAcquirer(t *testing.T) {
	ctx := context.Background()
	names := []string{"c", "a", "b"}
	for _, tc := range []struct {
		answer          error
		try             bool
		ok              bool
		singles, multis int32
	}{
		{nil, true, true, 0, 1},
		{nil, false, true, 0, 1},
		{driver.Busy(time.Second), true, false, 0, 1},
		{driver.Busy(time.Second), false, true, 3, 1},
		{fmt.Errorf("no: %w", errors.ErrUnsupported), true, true, 3, 1},
	} {
		d := &multiDriver{answer: tc.answer}
		l, err := dlock.New(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		acquire := l.AcquireAll
		if tc.try {
			acquire = l.TryAcquireAll
		}
		ls, err := acquire(ctx, names, nil)
		if (err == nil) != tc.ok || !tc.ok && !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("answer %v, try %v: %v", tc.answer, tc.try, err)
		}
		if d.singles.Load() != tc.singles || d.multis.Load() != tc.multis {
			t.Errorf("answer %v, try %v: %d single and %d multiple attempts, want %d and %d",
				tc.answer, tc.try, d.singles.Load(), d.multis.Load(), tc.singles, tc.multis)
		}
		if ls != nil {
			if got := ls.Names(); !slices.Equal(got, []string{"a", "b", "c"}) {
				t.Errorf("Names() = %q", got)
			}
			_ = ls.Release(ctx)
		}
		_ = l.Close(ctx)
	}
}
