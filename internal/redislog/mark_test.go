package redislog

import (
	"context"
	"errors"
	"testing"
)

type key struct{}

// A marked context is marked, and otherwise its parent: values,
// cancellation (with its cause) and contexts derived from it.
func TestMark(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	if marked(parent) {
		t.Fatal("parent marked before Mark")
	}
	ctx := Mark(parent)
	if !marked(ctx) || Mark(ctx) != ctx {
		t.Fatalf("Mark(parent): marked %v, Mark again the same %v; want both", marked(ctx), Mark(ctx) == ctx)
	}
	if got := ctx.Value(key{}); got != "v" {
		t.Fatalf("Value(key) = %v, want the parent's v", got)
	}
	child, stop := context.WithCancel(ctx)
	defer stop()
	if !marked(child) || !marked(Mark(child)) {
		t.Fatal("a child of a marked context is not marked")
	}
	cause := errors.New("cause")
	cancel(cause)
	<-ctx.Done()
	<-child.Done()
	if !errors.Is(ctx.Err(), context.Canceled) || context.Cause(ctx) != cause || context.Cause(child) != cause {
		t.Fatalf("after cancel: Err %v, Cause %v, child's Cause %v; want Canceled, cause, cause", ctx.Err(), context.Cause(ctx), context.Cause(child))
	}
}
