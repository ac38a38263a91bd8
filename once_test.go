package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memory"
)

func TestSlot(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		t      string
		period time.Duration
		want   string
	}{
		{"2026-11-28T03:00:00Z", time.Minute, "2026-11-28T03:00:00Z"},
		{"2026-11-28T03:00:29Z", time.Minute, "2026-11-28T03:00:00Z"},
		{"2026-11-28T02:59:31Z", time.Minute, "2026-11-28T03:00:00Z"},
		{"2026-11-28T03:00:31Z", time.Minute, "2026-11-28T03:01:00Z"},
		{"2026-11-28T04:00:05+01:00", time.Hour, "2026-11-28T03:00:00Z"}, // UTC whatever the zone
		{"2026-11-28T02:00:00Z", 24 * time.Hour, "2026-11-28T00:00:00Z"},
		{"2026-11-28T03:00:00.130Z", 200 * time.Millisecond, "2026-11-28T03:00:00.2Z"},
		{"2026-11-28T03:00:00Z", 0, ""},
		{"2026-11-28T03:00:00Z", -time.Second, ""},
	} {
		if got := dlock.Slot(at(tc.t), tc.period); got != tc.want {
			t.Errorf("Slot(%s, %v) = %q; want %q", tc.t, tc.period, got, tc.want)
		}
	}
	// Clocks less than period/2 apart, read near a boundary, agree.
	b := at("2026-11-28T03:00:00Z")
	for _, d := range []time.Duration{-29 * time.Second, -time.Second, 0, time.Second, 29 * time.Second} {
		if got := dlock.Slot(b.Add(d), time.Minute); got != "2026-11-28T03:00:00Z" {
			t.Errorf("a clock %v off at the boundary reads slot %s", d, got)
		}
	}
}

// noRecords is a driver that keeps no records.
type noRecords struct{}

func (noRecords) Capabilities() driver.Capabilities { return driver.Capabilities{} }
func (noRecords) TryAcquire(context.Context, driver.Request) (*driver.Grant, error) {
	return nil, errors.New("noRecords: no I/O expected")
}
func (noRecords) Close() error { return nil }

// TestOnceInvalid proves that bad input is ErrInvalid before any I/O (the
// link is black-holed: any request would hang until the test's deadline),
// and a backend without records ErrUnsupported.
func TestOnceInvalid(t *testing.T) {
	link := memory.NewLink()
	link.Blackhole()
	defer link.Heal()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	fn := func(context.Context, *dlock.Lease) error { return nil }
	slot := "2026-11-28T03:00:00Z"
	for _, tc := range []struct {
		what      string
		ctx       context.Context
		job, slot string
		opts      *dlock.OnceOptions
		fn        func(context.Context, *dlock.Lease) error
	}{
		{"nil ctx", nil, "j", slot, nil, fn},
		{"nil fn", ctx, "j", slot, nil, nil},
		{"empty job", ctx, "", slot, nil, fn},
		{"empty slot", ctx, "j", "", nil, fn},
		{"slot with /", ctx, "j", "a/b", nil, fn},
		{"negative retention", ctx, "j", slot, &dlock.OnceOptions{Retention: -time.Second}, fn},
		{"negative attempts", ctx, "j", slot, &dlock.OnceOptions{MaxAttempts: -1}, fn},
		{"negative TTL", ctx, "j", slot, &dlock.OnceOptions{Lock: &dlock.Options{TTL: -time.Second}}, fn},
		{"name too long", ctx, strings.Repeat("j", dlock.MaxNameLen), slot, nil, fn},
	} {
		start := time.Now()
		err := l.Once(tc.ctx, tc.job, tc.slot, tc.opts, tc.fn)
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", tc.what, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: took %v: it did I/O", tc.what, d)
		}
	}
	nl, err := dlock.New(noRecords{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close(context.Background())
	if err := nl.Once(ctx, "j", slot, nil, fn); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Once on a driver without Records: %v; want errors.ErrUnsupported", err)
	}
}

// TestOnceTwoHostsSkewedClocks is the cron case on mem://: two hosts (two
// Lockers) whose clocks differ by 30% of the period each try a job at every
// boundary of their own clock, for 100 consecutive slots of 200ms; the job
// takes a fifth of the period. Every slot runs exactly once.
func TestOnceTwoHostsSkewedClocks(t *testing.T) {
	const (
		slots  = 100
		period = 200 * time.Millisecond
		skew   = period * 3 / 10
	)
	store := memory.NewStore()
	a, b := memLocker(t, store), memLocker(t, store)
	ctx, cancel := context.WithTimeout(t.Context(), slots*period+30*time.Second)
	defer cancel()
	var mu sync.Mutex
	runs := map[string]int{}
	late := 0 // wake-ups too late for the slot's own boundary (the machine stalled)
	first := time.Now().Truncate(period).Add(2 * period)
	host := func(l *dlock.Locker, offset time.Duration) error {
		for i := range slots {
			at := first.Add(time.Duration(i)*period - offset) // the host's own boundary
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				return ctx.Err()
			}
			now := time.Now()
			if now.Sub(at) >= period/2 {
				mu.Lock()
				late++
				mu.Unlock()
			}
			slot := dlock.Slot(now.Add(offset), period)
			err := l.Once(ctx, "report", slot, &dlock.OnceOptions{Retention: time.Minute}, func(ctx context.Context, _ *dlock.Lease) error {
				mu.Lock()
				runs[slot]++
				mu.Unlock()
				select {
				case <-time.After(period / 5):
				case <-ctx.Done():
				}
				return nil
			})
			if err != nil && !errors.Is(err, dlock.ErrAlreadyDone) {
				return fmt.Errorf("slot %s: %w", slot, err)
			}
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- host(a, 0) }()
	go func() { errs <- host(b, skew) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for i := range slots {
		slot := dlock.Slot(first.Add(time.Duration(i)*period), period)
		if n := runs[slot]; n > 1 {
			t.Errorf("slot %s ran %d times", slot, n) // never, however late the hosts
		} else if n == 0 && late == 0 {
			t.Errorf("slot %s never ran", slot)
		}
		total += runs[slot]
	}
	if total != slots && late == 0 {
		t.Errorf("%d runs in %d slots (%v); want %d", total, slots, runs, slots)
	}
	t.Logf("%d slots of %v, clocks %v apart: %d runs (%d late wake-ups)", slots, period, skew, total, late)
}

// TestOnceNoWait proves that NoWait returns ErrNotAcquired at once while
// another host runs the slot, and that waiting callers find it done.
func TestOnceNoWait(t *testing.T) {
	store := memory.NewStore()
	a, b := memLocker(t, store), memLocker(t, store)
	ctx := t.Context()
	slot := "2026-11-28T03:00:00Z"
	running, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.Once(ctx, "job", slot, nil, func(context.Context, *dlock.Lease) error {
			close(running)
			<-finish
			return nil
		})
	}()
	<-running
	if err := b.Once(ctx, "job", slot, &dlock.OnceOptions{NoWait: true}, func(context.Context, *dlock.Lease) error {
		t.Error("fn ran while another host ran the slot")
		return nil
	}); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("NoWait while another runs the slot: %v; want ErrNotAcquired", err)
	}
	waited := make(chan error, 1)
	go func() {
		waited <- b.Once(ctx, "job", slot, nil, func(context.Context, *dlock.Lease) error {
			t.Error("fn ran again after the slot completed")
			return nil
		})
	}()
	close(finish)
	if err := <-done; err != nil {
		t.Fatalf("the run: %v", err)
	}
	if err := <-waited; !errors.Is(err, dlock.ErrAlreadyDone) {
		t.Errorf("a caller that waited for the run: %v; want ErrAlreadyDone", err)
	}
}

// TestOnceRetention proves that a record is kept for the retention only:
// past it, the slot is forgotten and runs again.
func TestOnceRetention(t *testing.T) {
	store := memory.NewStore()
	l := memLocker(t, store)
	ctx := t.Context()
	opts := &dlock.OnceOptions{Retention: 100 * time.Millisecond}
	ran := 0
	fn := func(context.Context, *dlock.Lease) error { ran++; return nil }
	if err := l.Once(ctx, "job", "s1", opts, fn); err != nil {
		t.Fatal(err)
	}
	if err := l.Once(ctx, "job", "s1", opts, fn); !errors.Is(err, dlock.ErrAlreadyDone) {
		t.Fatalf("within the retention: %v; want ErrAlreadyDone", err)
	}
	if store.Records() != 1 {
		t.Errorf("store keeps %d records; want 1", store.Records())
	}
	time.Sleep(150 * time.Millisecond) // past the retention: the store's clock is the process's
	if err := l.Once(ctx, "job", "s1", opts, fn); err != nil || ran != 2 {
		t.Errorf("past the retention: %v, ran %d times; want nil, 2", err, ran)
	}
}

// TestOnceRecordsAfterCtxEnds proves that a run that completed is recorded
// even when ctx ended as fn returned: the work was done.
func TestOnceRecordsAfterCtxEnds(t *testing.T) {
	l := memLocker(t, memory.NewStore())
	ctx, cancel := context.WithCancel(t.Context())
	err := l.Once(ctx, "job", "s1", nil, func(context.Context, *dlock.Lease) error {
		cancel()
		return nil
	})
	if err != nil {
		t.Fatalf("Once whose ctx ended as fn returned nil: %v; want nil", err)
	}
	if err := l.Once(t.Context(), "job", "s1", nil, func(context.Context, *dlock.Lease) error { return nil }); !errors.Is(err, dlock.ErrAlreadyDone) {
		t.Errorf("after: %v; want ErrAlreadyDone", err)
	}
}
