package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// dlock steal on mem:// (in this process): the holder's lease ends as taken
// over, the first waiter gets the lock with a higher fence, and the output
// shows the holder before and the new one after. Without -yes and without
// a terminal it refuses, doing nothing.
func TestSteal(t *testing.T) {
	ctx := t.Context()
	l, err := dlock.Open(ctx, "mem://steal-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	held, err := l.Acquire(ctx, "jobs/stuck", &dlock.Options{TTL: 600 * time.Millisecond, Metadata: "host=a"})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := held.Fence()

	if code, _, errOut := runCmd(t, "steal", "mem://steal-test", "jobs/stuck"); code != exitUsage || !strings.Contains(errOut, "-yes") {
		t.Fatalf("without -yes and a terminal: status %d, stderr %q; want %d asking for -yes", code, errOut, exitUsage)
	}
	if held.Err() != nil {
		t.Fatalf("the refused steal ended the lease: %v", held.Err())
	}

	waiter := make(chan *dlock.Lease, 1)
	go func() {
		ls, err := l.Acquire(ctx, "jobs/stuck", &dlock.Options{TTL: time.Minute, Metadata: "host=b"})
		if err != nil {
			t.Error(err)
		}
		waiter <- ls
	}()
	code, out, errOut := runCmd(t, "steal", "-yes", "mem://steal-test", "jobs/stuck")
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	if !strings.Contains(out, "before:") || !strings.Contains(out, "host=a") || !strings.Contains(out, "took \"jobs/stuck\" over with fence") {
		t.Errorf("output:\n%s\nwant the holder before (host=a) and the steal's fence", out)
	}
	select {
	case <-held.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's lease did not end after the steal")
	}
	if !errors.Is(held.Err(), dlock.ErrLost) || !errors.Is(held.Err(), dlock.ErrTakenOver) {
		t.Errorf("holder's Err = %v; want ErrLost and ErrTakenOver", held.Err())
	}
	var next *dlock.Lease
	select {
	case next = <-waiter:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted after the steal's release")
	}
	if next == nil {
		t.FailNow()
	}
	after, _ := next.Fence()
	if after <= before+1 {
		t.Errorf("the waiter's fence %d; want above the steal's, itself above the holder's %d", after, before)
	}
	_ = next.Release(ctx)
}
