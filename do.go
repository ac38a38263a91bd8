package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Do acquires name (waiting as Acquire does), runs fn with the lease and a
// context that ends when ctx ends or the lease is lost, and then releases the
// lock. fn passes lease.Fence() to the resource it protects. Do returns fn's
// error joined with a release error, or with the loss reason when the lease
// was lost while fn ran; an acquisition that fails returns its error without
// calling fn.
func Do(ctx context.Context, l *Locker, name string, opts *Options, fn func(ctx context.Context, lease *Lease) error) error {
	ls, err := l.Acquire(ctx, name, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ls.Context(), func() { cancel(context.Cause(ls.Context())) })
	ferr := fn(fctx, ls)
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
