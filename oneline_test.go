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

// An acquisition cut short by its ctx reports one line that still matches
// both ErrNotAcquired and the ctx's error, for a lock and a semaphore.
func TestWaitErrorIsOneLine(t *testing.T) {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := memory.New(store, nil)
	b, _ := memory.New(store, nil)
	defer a.Close(ctx)
	defer b.Close(ctx)
	held, err := a.Acquire(ctx, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	semA, _ := a.Semaphore("encoders", 1)
	semB, _ := b.Semaphore("encoders", 1)
	permit, err := semA.Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer permit.Release(ctx)

	for _, tc := range []struct {
		name    string
		acquire func(context.Context) (*dlock.Lease, error)
	}{
		{"lock", func(ctx context.Context) (*dlock.Lease, error) { return b.Acquire(ctx, "job", nil) }},
		{"semaphore", func(ctx context.Context) (*dlock.Lease, error) { return semB.Acquire(ctx, nil) }},
		{"ended before", func(context.Context) (*dlock.Lease, error) {
			ctx, cancel := context.WithTimeout(ctx, 0)
			defer cancel()
			<-ctx.Done()
			return b.Acquire(ctx, "job", nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_, err := tc.acquire(wctx)
			if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("got %v, want ErrNotAcquired and context.DeadlineExceeded", err)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") {
				t.Errorf("got %q, want one line", msg)
			}
			if got, want := err.Error(), "dlock: lock not acquired: context deadline exceeded"; !strings.HasPrefix(got, want) {
				t.Errorf("got %q, want it to start with %q", got, want)
			}
		})
	}
}

// A full semaphore says so in a semaphore's words, not a lock's, and still
// matches ErrNotAcquired and carries the driver's *BusyError.
func TestSemaphoreFullWording(t *testing.T) {
	ctx := context.Background()
	l, _ := memory.New(memory.NewStore(), nil)
	defer l.Close(ctx)
	sem, _ := l.Semaphore("encoders", 2)
	p1, _ := sem.Acquire(ctx, nil)
	p2, _ := sem.Acquire(ctx, nil)
	defer p1.Release(ctx)
	defer p2.Release(ctx)
	_, err := sem.TryAcquire(ctx, nil)
	var busy *driver.BusyError
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.As(err, &busy) {
		t.Fatalf("got %v, want ErrNotAcquired and a *driver.BusyError", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "another owner") || !strings.Contains(msg, `all 2 permits of semaphore "encoders" are held`) {
		t.Errorf("got %q, want semaphore wording", msg)
	}
}
