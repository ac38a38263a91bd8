package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Do acquires name (waiting as Acquire does), runs fn with a context that is
// cancelled when ctx ends or the lease is lost, and releases the lock. It
// returns fn's error joined with a release error, or with the loss reason
// when the lease was lost while fn ran (the seeds' lockFunction).
func Do(ctx context.Context, l Locker, name string, opts *Options, fn func(ctx context.Context) error) error {
	ls, err := l.Acquire(ctx, name, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ls.Context(), func() { cancel(context.Cause(ls.Context())) })
	ferr := fn(fctx)
	stop()
	cancel(nil)

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout(ls))
	defer rcancel()
	if rerr := ls.Release(rctx); rerr != nil {
		if errors.Is(rerr, ErrNotHeld) {
			rerr = fmt.Errorf("dlock: %q was lost while held: %w", name, rerr)
		}
		return errors.Join(ferr, rerr)
	}
	return ferr
}

// releaseTimeout bounds a release made after the caller's ctx may have ended:
// never longer than the lock itself lives.
func releaseTimeout(ls *Lease) time.Duration {
	return max(ls.TTL(), time.Second)
}
