// Package readme_test runs the README's snippets that need a server; the
// root package's TestReadmeSnippets checks that the README shows them as
// they are here.
package readme_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/tests/internal/testutil"
)

import _ "github.com/dlock/dlock/redis" // links the driver in: dlock.Open takes redis:// and rediss:// URLs

func TestMain(m *testing.M) { dlocktest.Main(m) }

// The README's first snippet takes a lock on Redis, works under it with a
// fencing token and a live lease context, and leaves nothing held.
func TestNightlyReport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "redis://" + dlocktest.Require(t, dlocktest.Redis).Addr() + "/0?ttl=10s&prefix=readme-" + testutil.RandomHex(4) + ":"
	var got struct {
		fence uint64
		live  bool
	}
	work = func(ctx context.Context, fence uint64) error {
		got.fence, got.live = fence, ctx.Err() == nil
		return nil
	}
	if err := nightlyReport(ctx, url); err != nil {
		t.Fatal(err)
	}
	if got.fence == 0 || !got.live {
		t.Errorf("got fence %d, lease context live %v; want a fence and a live context", got.fence, got.live)
	}
	l, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	info, err := l.Inspect(ctx, "nightly-report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Held {
		t.Errorf("nightly-report still held after the snippet returned: %+v", info)
	}
}

func nightlyReport(ctx context.Context, url string) error {
	l, err := dlock.Open(ctx, url) // such as "redis://127.0.0.1:6379/0?ttl=10s"
	if err != nil {
		return err
	}
	defer l.Close(ctx) // releases whatever is still held

	ls, err := l.Acquire(ctx, "nightly-report", nil) // waits; TryAcquire makes one attempt
	if err != nil {
		return err // errors.Is(err, dlock.ErrNotAcquired) when ctx ended first
	}
	defer ls.Release(ctx)              // removes only this lease's lock
	fence, _ := ls.Fence()             // pass it to the storage you protect
	return doWork(ls.Context(), fence) // ls.Context() is cancelled if the lock is lost
}

// work is what doWork does; the test sets it.
var work func(ctx context.Context, fence uint64) error

func doWork(ctx context.Context, fence uint64) error { return work(ctx, fence) }
