package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
)

// Two hosts run the same hourly job from cron; each tries it at the top of
// the hour by its own clock. The first to get there runs it; the other finds
// the hour done.
func ExampleLocker_Once() {
	ctx := context.Background()
	backend := memory.NewStore() // in real use: dlock.Open(ctx, "etcd://…") on each host
	hostA, _ := memory.New(backend, nil)
	hostB, _ := memory.New(backend, nil)
	defer hostA.Close(ctx)
	defer hostB.Close(ctx)

	now, _ := time.Parse(time.RFC3339, "2026-11-28T03:00:02Z") // time.Now() in real use
	slot := dlock.Slot(now, time.Hour)
	opts := &dlock.OnceOptions{Retention: 48 * time.Hour}
	for _, host := range []*dlock.Locker{hostA, hostB} {
		err := host.Once(ctx, "hourly-report", slot, opts, func(ctx context.Context, lease *dlock.Lease) error {
			fmt.Println("running the report for", slot)
			return nil // an error leaves the slot to be tried again
		})
		switch {
		case errors.Is(err, dlock.ErrAlreadyDone):
			fmt.Println("done already")
		case err != nil:
			fmt.Println(err)
		}
	}
	// Output:
	// running the report for 2026-11-28T03:00:00Z
	// done already
}
