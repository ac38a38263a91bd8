package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/memory"
)

// TestMemoryRefusesEndedHolder proves the protocol end to end on the memory
// backend: a holder whose lease ended without its knowing (no refresh, as
// if its process were frozen) writes after the next holder has, and the
// guard refuses it; the next holder's value stays.
func TestMemoryRefusesEndedHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)

	old, err := l.Acquire(ctx, "report", &dlock.Options{TTL: 100 * time.Millisecond, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	oldToken, err := fence.Token(old)
	if err != nil {
		t.Fatal(err)
	}
	<-old.Done() // the frozen holder's lease has ended; it will still write

	next, err := l.Acquire(ctx, "report", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	nextToken, err := fence.Token(next)
	if err != nil {
		t.Fatal(err)
	}
	if nextToken <= oldToken {
		t.Fatalf("fences: next %d, old %d; want next > old", nextToken, oldToken)
	}

	var g fence.Memory
	var stored string
	write := func(v string) func() error { return func() error { stored = v; return nil } }
	if err := g.Write("report", nextToken, write("next")); err != nil {
		t.Fatalf("next holder's write: %v", err)
	}
	if err := g.Write("report", nextToken, write("next again")); err != nil {
		t.Fatalf("next holder's second write, same fence: %v", err)
	}
	err = g.Write("report", oldToken, write("old"))
	var stale *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &stale) || stale.Highest != nextToken || stale.Token != oldToken {
		t.Fatalf("old holder's write: got %v, want a StaleError of fence %d over %d", err, oldToken, nextToken)
	}
	if stored != "next again" {
		t.Errorf("stored %q after the refused write, want %q", stored, "next again")
	}
	if h, ok := g.Highest("report"); !ok || h != nextToken {
		t.Errorf("Highest = %d, %v; want %d, true", h, ok, nextToken)
	}
}

// TestMemoryWriteErrorRecordsNothing proves that a failed write does not
// raise the resource's fence, and that bad input is refused.
func TestMemoryWriteErrorRecordsNothing(t *testing.T) {
	var g fence.Memory
	boom := errors.New("boom")
	if err := g.Write("r", 7, func() error { return boom }); err != boom {
		t.Fatalf("got %v, want the write's own error", err)
	}
	if h, ok := g.Highest("r"); ok {
		t.Fatalf("Highest after a failed write = %d, want none", h)
	}
	if err := g.Write("r", 3, func() error { return nil }); err != nil {
		t.Fatalf("a lower fence after a failed write: %v, want accepted", err)
	}
	if err := g.Write("", 3, func() error { return nil }); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("empty resource: got %v, want ErrInvalid", err)
	}
	if _, err := fence.Token(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Token(nil): got %v, want ErrInvalid", err)
	}
}
