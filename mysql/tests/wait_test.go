package tests_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
)

// A waiting Acquire waits in GET_LOCK on the server, and one given up on
// (its ctx cancelled, with no deadline: the server's wait would last
// 30s) leaves no session waiting: the driver KILLs it (in about 10ms; on
// its own MariaDB notices the closed connection about a second later).
func TestWaitGivenUp(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.MariaDB).Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	h := harness{addr: addr, raw: rawDB(t, addr)}
	open := func() *dlock.Locker {
		l, err := dlock.Open(ctx, url(addr, "ttl=5s"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	holder, waiter := open(), open()
	name := "wait-" + t.Name()
	ls, err := holder.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(context.Background())

	wctx, wcancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, name, nil)
		errc <- err
	}()
	waiting := func() int {
		t.Helper()
		left, err := h.Residue(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return len(left) - 1 // the holder's lock is one
	}
	for end := time.Now().Add(10 * time.Second); waiting() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no session waits in GET_LOCK for the name")
		}
	}
	wcancel()
	if err := <-errc; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire cancelled while waiting: got %v, want ErrNotAcquired and context.Canceled", err)
	}
	for end := time.Now().Add(3 * time.Second); waiting() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the given-up wait's session still waits on the server 3s after its cancel")
		}
	}
}
