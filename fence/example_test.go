package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/fence"
	_ "github.com/dlock/dlock/memory"
)

// A write carries the lease's fence; the guard refuses a holder whose lock
// has since been granted to another that has written.
func Example() {
	ctx := context.Background()
	l, _ := dlock.Open(ctx, "mem://")
	defer l.Close(ctx)

	var store fence.Memory // in production: pgfence, redisfence
	balance := 0
	deposit := func(ls *dlock.Lease, amount int) error {
		token, err := fence.Token(ls)
		if err != nil {
			return err
		}
		return store.Write("account:42", token, func() error { balance += amount; return nil })
	}

	first, _ := l.Acquire(ctx, "account:42", nil)
	first.Release(ctx) // stands for a lease that ended while its holder was paused
	second, _ := l.Acquire(ctx, "account:42", nil)
	defer second.Release(ctx)

	fmt.Println(deposit(second, 10))
	err := deposit(first, 5) // the paused holder wakes and writes
	fmt.Println(errors.Is(err, fence.ErrStale), balance)
	// Output:
	// <nil>
	// true 10
}
