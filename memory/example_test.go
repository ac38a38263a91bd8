package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
)

// Test code that takes locks without a server: Lockers on one Store exclude
// each other as separate processes on one backend would.
func Example() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := memory.New(store, nil)
	b, _ := memory.New(store, nil)
	defer a.Close(ctx)
	defer b.Close(ctx)

	lease, _ := a.Acquire(ctx, "job", nil)
	_, err := b.TryAcquire(ctx, "job", nil)
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	_ = lease.Release(ctx)
	// Output: true
}

// A Link between a Locker and its Store breaks the path on purpose: here the
// holder is cut off, cannot refresh, and its lease reports the loss.
func ExampleLink() {
	ctx := context.Background()
	link := memory.NewLink()
	l, _ := memory.New(memory.NewStore(), &memory.Options{Link: link, Defaults: dlock.Options{TTL: 50 * time.Millisecond}})
	defer l.Close(ctx)

	lease, _ := l.Acquire(ctx, "job", nil)
	link.Blackhole()
	<-lease.Done()
	link.Heal()
	fmt.Println(errors.Is(lease.Err(), dlock.ErrLost))
	// Output: true
}
