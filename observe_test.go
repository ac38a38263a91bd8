package dlock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
)

// recorder is a Hook that keeps the events.
type recorder struct {
	mu       sync.Mutex
	events   []dlock.Event
	lost     chan struct{}
	lostOnce sync.Once
}

func (r *recorder) hook(ev dlock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	if ev.Kind == dlock.EventLost {
		r.lostOnce.Do(func() { close(r.lost) })
	}
}

func (r *recorder) has(k dlock.EventKind) bool {
	return slices.Contains(r.kinds(), k)
}

// failRefreshes partitions the link and resets it every 10ms until failed
// reports that a refresh failed (a reset fails the requests hanging in the
// partition), then leaves it partitioned: the lease is lost at its
// ValidUntil.
func failRefreshes(t *testing.T, link *memory.Link, failed func() bool) {
	t.Helper()
	link.Blackhole()
	for end := time.Now().Add(10 * time.Second); !failed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no refresh failure within 10s of the partition")
		}
		link.Reset()
	}
}

func (r *recorder) kinds() []dlock.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []dlock.EventKind
	for _, e := range r.events {
		ks = append(ks, e.Kind)
	}
	return ks
}

// The hook sees, in order: an acquisition with its wait and fence, a failed
// TryAcquire, a release with the time held, then, on a partitioned Locker,
// refresh failures and the loss with its reason.
func TestObserverHook(t *testing.T) {
	ctx := t.Context()
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	r := &recorder{lost: make(chan struct{})}
	l.SetObserver(dlock.Observer{Hook: r.hook})

	ls, err := l.Acquire(ctx, "a", &dlock.Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "a", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held name: %v", err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ls, err = l.Acquire(ctx, "b", &dlock.Options{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	failRefreshes(t, link, func() bool { return r.has(dlock.EventRefreshFailed) })
	select {
	case <-r.lost:
	case <-time.After(10 * time.Second):
		t.Fatal("no EventLost within 10s of the partition")
	}
	link.Heal()

	r.mu.Lock()
	evs := append([]dlock.Event(nil), r.events...)
	r.mu.Unlock()
	want := []dlock.EventKind{dlock.EventAcquired, dlock.EventAcquireFailed, dlock.EventReleased, dlock.EventAcquired}
	if len(evs) < len(want)+2 {
		t.Fatalf("events %v, want %v then refresh failures and a loss", r.kinds(), want)
	}
	for i, k := range want {
		if evs[i].Kind != k {
			t.Fatalf("events %v, want %v then refresh failures and a loss", r.kinds(), want)
		}
	}
	fence, _ := ls.Fence()
	switch acq, failed, rel, last := evs[0], evs[1], evs[2], evs[len(evs)-1]; {
	case acq.Name != "a" || acq.Duration <= 0 || acq.Fence == 0 || acq.ValidUntil.IsZero() || acq.Context != ctx:
		t.Errorf("EventAcquired: %+v", acq)
	case !errors.Is(failed.Err, dlock.ErrNotAcquired):
		t.Errorf("EventAcquireFailed: %+v", failed)
	case rel.Name != "a" || rel.Held <= 0 || rel.Duration <= 0 || rel.Held < rel.Duration:
		t.Errorf("EventReleased: %+v", rel)
	case last.Kind != dlock.EventLost || last.Name != "b" || !errors.Is(last.Err, dlock.ErrLost) || last.Fence != fence || last.Held < 200*time.Millisecond:
		t.Errorf("last event: %+v, want the loss of b", last)
	}
	for _, e := range evs[len(want) : len(evs)-1] {
		if e.Kind != dlock.EventRefreshFailed || e.Err == nil || e.Name != "b" {
			t.Errorf("between the acquisition of b and its loss: %+v, want refresh failures", e)
		}
	}
}

// The logger gets a Warn per refresh failure and an Error for the loss, with
// the lock's name and without its token; a slow acquisition is Info;
// acquisitions and releases are Debug. The zero Observer is silent.
func TestObserverLogger(t *testing.T) {
	ctx := t.Context()
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l.SetObserver(dlock.Observer{Logger: logger, SlowAcquire: time.Nanosecond})
	ls, err := l.Acquire(ctx, "jobs/x", &dlock.Options{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	failRefreshes(t, link, func() bool { return strings.Contains(buf.String(), "refresh failed") })
	for end := time.Now().Add(10 * time.Second); !strings.Contains(buf.String(), "lease lost"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no loss logged within 10s of the partition")
		}
	}
	link.Heal()
	l.SetObserver(dlock.Observer{})
	quiet, err := l.Acquire(ctx, "jobs/quiet", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = quiet.Release(ctx)

	levels := map[string]int{}
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["lock"] != "jobs/x" {
			t.Errorf("record without the lock's name, or of a silenced acquisition: %s", line)
		}
		levels[rec["level"].(string)+" "+rec["msg"].(string)]++
	}
	for _, want := range []string{"INFO dlock: slow acquisition", "WARN dlock: refresh failed; retrying until the lease's validity ends", "ERROR dlock: lease lost"} {
		if levels[want] == 0 {
			t.Errorf("no record %q; got %v", want, levels)
		}
	}
	if strings.Contains(buf.String(), ls.Token()) {
		t.Error("the log shows the lease's token")
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// BenchmarkObserver: acquire+release on the memory driver with no
// Observer, with a no-op Hook, and with a Logger whose handler discards
// (Debug records are then built and dropped by Enabled).
//
//	go test -run '^$' -bench Observer -benchmem .
func BenchmarkObserver(b *testing.B) {
	for _, bc := range []struct {
		name string
		obs  dlock.Observer
	}{
		{"none", dlock.Observer{}},
		{"noop-hook", dlock.Observer{Hook: func(dlock.Event) {}}},
		{"discard-logger", dlock.Observer{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			l, err := memory.New(memory.NewStore(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close(ctx)
			l.SetObserver(bc.obs)
			b.ReportAllocs()
			for b.Loop() {
				ls, err := l.Acquire(ctx, "bench", nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := ls.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
