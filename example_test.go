package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/memory"
)

func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example?ttl=10s")
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	lease, err := locker.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		panic(err)
	}
	// Bind the work to the lease: its context ends if the lock is lost.
	report(lease.Context(), lease.Name())

	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println(lease.Err())
	// Output:
	// holding nightly-report
	// dlock: lease released
}

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	a, _ := dlock.Open(ctx, "mem://try")
	b, _ := dlock.Open(ctx, "mem://try")
	defer a.Close(ctx)
	defer b.Close(ctx)

	held, _ := a.TryAcquire(ctx, "job-42", nil)
	_, err := b.TryAcquire(ctx, "job-42", nil)
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	_ = held.Release(ctx)
	// Output: true
}

func ExampleDo() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://do")
	defer locker.Close(ctx)

	err := dlock.Do(ctx, locker, "migrate-schema", &dlock.Options{TTL: 5 * time.Second},
		func(ctx context.Context, lease *dlock.Lease) error {
			// ctx ends if the lease is lost; the fence goes with every write.
			_, ok := lease.Fence()
			fmt.Println("migrating while holding the lock; fencing token:", ok)
			return nil
		})
	fmt.Println(err)
	// Output:
	// migrating while holding the lock; fencing token: true
	// <nil>
}

func ExampleLease_Fence() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://fence")
	defer locker.Close(ctx)

	first, _ := locker.Acquire(ctx, "ledger", nil)
	f1, _ := first.Fence()
	_ = first.Release(ctx)
	second, _ := locker.Acquire(ctx, "ledger", nil)
	f2, ok := second.Fence()
	_ = second.Release(ctx)
	// Storage that remembers the highest token it has seen can refuse a
	// write from the first holder after the second one took over.
	fmt.Println(ok, f2 > f1)
	// Output: true true
}

func report(ctx context.Context, name string) {
	if ctx.Err() == nil {
		fmt.Println("holding", name)
	}
}
