package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
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

// A semaphore: at most 2 encoders at once, across every process using the
// name; a third TryAcquire is refused until a permit comes back.
func ExampleSemaphore() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-semaphore")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)
	sem, err := locker.Semaphore("encoders", 2)
	if err != nil {
		log.Fatal(err)
	}
	a, _ := sem.Acquire(ctx, nil)
	b, _ := sem.Acquire(ctx, nil)
	_, err = sem.TryAcquire(ctx, nil)
	fmt.Println("third permit refused:", errors.Is(err, dlock.ErrNotAcquired))
	_ = a.Release(ctx)
	c, err := sem.TryAcquire(ctx, nil)
	fmt.Println("after a release:", err == nil)
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// third permit refused: true
	// after a release: true
}

// Leader election: Elect returns when this candidate leads; the lease's
// Context ends if leadership is lost, and its fence is the term.
func ExampleLocker_Elect() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-elect")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)
	lead, err := locker.Elect(ctx, "controller", "pod-a", nil)
	if err != nil {
		log.Fatal(err)
	}
	who, err := locker.Leader(ctx, "controller")
	if err != nil {
		log.Fatal(err)
	}
	term, _ := lead.Fence()
	fmt.Println(who.Candidate, "leads, term matches:", who.Term == term)
	// run the controller under lead.Context() …
	_ = lead.Release(ctx) // resign
	who, _ = locker.Leader(ctx, "controller")
	fmt.Println("after resigning, anyone leads:", who.Held)
	// Output:
	// pod-a leads, term matches: true
	// after resigning, anyone leads: false
}

// A semaphore, a read lock and an election on one Locker: the README's
// snippet is encodeAndControl's body.
func Example_primitives() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-primitives")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)
	if err := encodeAndControl(ctx, locker, "pod-a"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// pod-a leads, in the term of its lease: true
	// controlling while leading
}

func encodeAndControl(ctx context.Context, locker *dlock.Locker, podName string) error {
	sem, err := locker.Semaphore("encoders", 3) // at most 3 permits at once, everywhere
	if err != nil {
		return err // errors.ErrUnsupported where the backend has no semaphores
	}
	permit, err := sem.Acquire(ctx, nil) // a *dlock.Lease; TryAcquire tries once
	if err != nil {
		return err
	}
	defer permit.Release(ctx)

	rw, err := locker.RWLock("catalog")
	if err != nil {
		return err
	}
	r, err := rw.RLock(ctx, nil) // readers share; Lock excludes everyone
	if err != nil {
		return err
	}
	defer r.Release(ctx)

	lead, err := locker.Elect(ctx, "controller", podName, nil) // returns once this candidate leads
	if err != nil {
		return err
	}
	defer lead.Release(ctx)                      // resigns
	who, err := locker.Leader(ctx, "controller") // who leads, since when, which term; Observe streams changes
	if err != nil {
		return err
	}
	term, _ := lead.Fence() // the term: strictly increasing from leader to leader
	fmt.Println(who.Candidate, "leads, in the term of its lease:", who.Term == term)
	return runController(lead.Context(), term) // lead.Context() ends when leadership is lost
}

func runController(ctx context.Context, term uint64) error {
	if ctx.Err() == nil {
		fmt.Println("controlling while leading")
	}
	return nil
}

// A logger for losses, failures and slow acquisitions, and a hook feeding
// metrics: the README's Observability snippet.
func ExampleLocker_SetObserver() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://example-observer")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	l.SetObserver(dlock.Observer{
		Logger:      slog.Default(),  // losses: Error; refresh failures: Warn; slow acquisitions: Info; the rest: Debug
		SlowAcquire: 2 * time.Second, // log acquisitions that waited this long
		Hook: func(ev dlock.Event) { // acquired (wait), acquire_failed, released (held), refresh_failed, lost (reason)
			metrics.Observe(ev.Kind.String(), ev.Name, ev.Duration)
		},
	})

	lease, err := l.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = lease.Release(ctx)
	// Output:
	// acquired nightly-report
	// released nightly-report
}

// metrics stands for an application's metrics library.
var metrics printMetrics

type printMetrics struct{}

func (printMetrics) Observe(kind, name string, d time.Duration) { fmt.Println(kind, name) }

func ExampleLocker_AcquireAll() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-all?ttl=10s")
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	// A transfer between two accounts holds both, or neither: names are
	// taken in sorted order, so a transfer the other way cannot deadlock it.
	lease, err := locker.AcquireAll(ctx, []string{"account/9", "account/7"}, nil)
	if err != nil {
		panic(err)
	}
	fences, _ := lease.Fences()
	fmt.Println(lease.Names(), len(fences))

	_, err = locker.TryAcquire(ctx, "account/7", nil)
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))

	if err := lease.Release(ctx); err != nil { // frees both
		panic(err)
	}
	// Output:
	// [account/7 account/9] 2
	// true
}

func ExampleLocker_Steal() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-steal?ttl=300ms")
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	stuck, err := locker.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		panic(err)
	}
	// An operator breaks the lock: the new lease has a higher fence, and
	// the old holder hears at its next refresh.
	mine, err := locker.Steal(ctx, "nightly-report", nil)
	if err != nil {
		panic(err)
	}
	<-stuck.Done()
	old, _ := stuck.Fence()
	now, _ := mine.Fence()
	fmt.Println(errors.Is(stuck.Err(), dlock.ErrTakenOver), now > old)
	_ = mine.Release(ctx)
	// Output:
	// true true
}
