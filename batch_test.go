package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// batchDriver keeps locks in a map and counts refreshes: alone and in
// batches.
type batchDriver struct {
	mu      sync.Mutex
	locks   map[string]string // name → token
	singles atomic.Int64
	batches atomic.Int64
	items   atomic.Int64
	failing atomic.Bool // every batch fails as a whole
}

type batchHandle struct {
	d           *batchDriver
	name, token string
}

func (d *batchDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: time.Millisecond}
}
func (d *batchDriver) Close() error { return nil }

func (d *batchDriver) TryAcquire(_ context.Context, req driver.Request) (*driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.locks[req.Name]; ok {
		return nil, driver.Busy(0)
	}
	d.locks[req.Name] = req.Token
	return &driver.Grant{Handle: &batchHandle{d, req.Name, req.Token}}, nil
}

func (h *batchHandle) mine() bool { return h.d.locks[h.name] == h.token }

func (h *batchHandle) Refresh(context.Context, time.Duration) (time.Duration, error) {
	h.d.singles.Add(1)
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	if !h.mine() {
		return 0, driver.ErrNotHeld
	}
	return 0, nil
}

func (h *batchHandle) Release(context.Context) error {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	if !h.mine() {
		return driver.ErrNotHeld
	}
	delete(h.d.locks, h.name)
	return nil
}

func (h *batchHandle) Held(context.Context) (bool, error) {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	return h.mine(), nil
}

func (d *batchDriver) RefreshBatch(_ context.Context, hs []driver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	d.batches.Add(1)
	d.items.Add(int64(len(hs)))
	errs := make([]error, len(hs))
	if d.failing.Load() {
		for i := range errs {
			errs[i] = errors.New("connection reset")
		}
		return make([]time.Duration, len(hs)), errs
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, h := range hs {
		if !h.(*batchHandle).mine() {
			errs[i] = driver.ErrNotHeld
		}
	}
	return make([]time.Duration, len(hs)), errs
}

// With a BatchRefresher, the watchdog refreshes many leases in few
// requests; each lease still gets its own outcome: the one whose lock was
// taken away is lost, the others keep theirs.
func TestBatchedRefresh(t *testing.T) {
	d := &batchDriver{locks: map[string]string{}}
	l, err := dlock.New(d, &dlock.Options{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 200
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("batch-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Three rounds of refreshes (every 100ms).
	for end := time.Now().Add(30 * time.Second); d.items.Load()+d.singles.Load() < 3*n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("only %d refreshes in 30s", d.items.Load()+d.singles.Load())
		}
	}
	batches, items, singles := d.batches.Load(), d.items.Load(), d.singles.Load()
	t.Logf("%d refreshes in %d batches, %d alone", items, batches, singles)
	if singles > items/10 || batches > items/4 {
		t.Errorf("%d refreshes in %d batches and %d alone: want most in batches of several", items, batches, singles)
	}
	// Batches that fail as a whole are tried again in batches, not one
	// request per lease.
	singles = d.singles.Load()
	failed := d.batches.Load()
	d.failing.Store(true)
	for end := time.Now().Add(30 * time.Second); d.batches.Load() < failed+3; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no batches while they failed")
		}
	}
	d.failing.Store(false)
	if s := d.singles.Load() - singles; s > n/10 {
		t.Errorf("%d refreshes alone after batches failed: want their retries batched", s)
	}
	d.mu.Lock()
	d.locks["batch-7"] = "someone else"
	d.mu.Unlock()
	select {
	case <-leases[7].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease whose lock was taken was not lost")
	}
	if !errors.Is(leases[7].Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v", leases[7].Err())
	}
	before := d.items.Load()
	for end := time.Now().Add(30 * time.Second); d.items.Load() < before+2*n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("refreshes stopped")
		}
	}
	for i, ls := range leases {
		if i != 7 && ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	left := len(d.locks)
	d.mu.Unlock()
	if left != 1 { // batch-7, someone else's
		t.Fatalf("%d locks left after Close; want only the one taken away", left)
	}
}
