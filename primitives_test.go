package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memory"
)

// Bad input to the primitives is ErrInvalid before any I/O; a primitive the
// backend lacks is errors.ErrUnsupported, naming it.
func TestPrimitivesBadInput(t *testing.T) {
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, limit := range []int{0, -1, dlock.MaxLimit + 1} {
		if _, err := l.Semaphore("s", limit); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Semaphore limit %d: %v; want ErrInvalid", limit, err)
		}
	}
	if _, err := l.Semaphore("", 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Semaphore empty name: %v", err)
	}
	if _, err := l.RWLock("a\x00b"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWLock NUL name: %v", err)
	}
	ctx := context.Background()
	if _, err := l.Elect(ctx, "e", "", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Elect empty candidate: %v", err)
	}
	if _, err := l.Elect(ctx, "e", strings.Repeat("x", dlock.MaxMetadataLen+1), nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Elect long candidate: %v", err)
	}
	if _, err := l.Elect(ctx, "e", "c", &dlock.Options{Metadata: "m"}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Elect with Metadata: %v", err)
	}
	if _, err := l.Elect(ctx, "", "c", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Elect empty name: %v", err)
	}
	if _, err := l.Leader(ctx, ""); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Leader empty name: %v", err)
	}
	//lint:ignore SA1012 a nil ctx is what this checks
	if _, err := l.Observe(nil, "e"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Observe nil ctx: %v", err)
	}
	sem, err := l.Semaphore("s", 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, &dlock.Options{TTL: -time.Second}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("permit with a negative TTL: %v", err)
	}
}

// lockOnly is a driver with locks only.
type lockOnly struct{ driver.Driver }

func (d lockOnly) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: time.Millisecond}
}

func TestPrimitivesUnsupported(t *testing.T) {
	l, err := dlock.New(lockOnly{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Semaphore("s", 2); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "semaphores") {
		t.Errorf("Semaphore: %v; want ErrUnsupported naming semaphores", err)
	}
	if _, err := l.RWLock("s"); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "read/write") {
		t.Errorf("RWLock: %v; want ErrUnsupported naming read/write locks", err)
	}
	if _, err := l.Elect(context.Background(), "s", "c", nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Elect: %v; want ErrUnsupported", err)
	}
	if _, err := l.Observe(context.Background(), "s"); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Observe: %v; want ErrUnsupported", err)
	}
}

// Observe's goroutine ends, and its channel closes, when the Locker closes.
func TestObserveEndsAtClose(t *testing.T) {
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := l.Observe(context.Background(), "e")
	if err != nil {
		t.Fatal(err)
	}
	if ld := <-c; ld.Held || ld.Name != "e" {
		t.Fatalf("first state %+v; want nobody leading e", ld)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case _, open := <-c:
		for open {
			_, open = <-c
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe's channel still open 5s after Close")
	}
	if _, err := l.Observe(context.Background(), "e"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Observe after Close: %v; want ErrClosed", err)
	}
}
