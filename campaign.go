package dlock

import (
	"context"
	"errors"

	"github.com/dlock/dlock/internal/backoff"
)

// Campaign runs fn as the leader of the election name, for as long as it
// takes: it campaigns (as Elect), runs fn while candidate leads, and
// campaigns again whenever the leadership is lost, until ctx ends or fn is
// done.
//
//   - fn gets the leadership (its term is lead.Fence) and a context that
//     ends when the leadership does — lost, or ctx ended — with the reason
//     as its cause.
//   - When the leadership is lost while fn runs (expired, taken over, the
//     backend unreachable until ValidUntil), Campaign waits for fn to
//     return and campaigns again. What fn returns then is not an outcome:
//     the loss ended it.
//   - When fn returns while candidate still leads, Campaign resigns at once
//     (Release: on backends that notify waiters the next candidate is
//     granted without waiting for a TTL) and returns fn's error; nil means
//     the work is done.
//   - When ctx ends, fn's context ends; Campaign waits for fn, resigns and
//     returns ctx's error.
//   - A campaign that fails for a reason a retry may fix (the backend
//     unreachable) is retried after a delay between opts' RetryMin and
//     RetryMax; an error no retry fixes (ErrInvalid, ErrUnsupported,
//     ErrClosed) is returned at once.
//
// fn must return soon after its context ends. Until it returns, Campaign
// cannot stop it, and another candidate's term may already have begun: a
// lease tells its holder of a loss no later than ValidUntil, but a process
// paused past that learns late. Write with the term (see package fence) so
// that a deposed leader's late writes are refused.
//
// opts are as for Elect.
func (l *Locker) Campaign(ctx context.Context, name, candidate string, opts *Options, fn func(ctx context.Context, lead *Lease) error) error {
	if fn == nil {
		return invalid("nil function")
	}
	if ctx == nil {
		return invalid("nil context")
	}
	o, err := opts.resolve(l.defaults, l.caps)
	if err != nil {
		return err
	}
	retry := backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax}
	for {
		lead, err := l.Elect(ctx, name, candidate, opts)
		switch {
		case ctx.Err() != nil:
			if lead != nil {
				resign(ctx, lead)
			}
			return ctx.Err()
		case errors.Is(err, ErrInvalid), errors.Is(err, errors.ErrUnsupported), errors.Is(err, ErrClosed):
			return err
		case err != nil:
			if !retry.Sleep(ctx) {
				return ctx.Err()
			}
			continue
		}
		retry.Reset()
		ferr := lead.run(ctx, fn)
		if lead.Err() != nil && ctx.Err() == nil {
			continue // lost: campaign again
		}
		resign(ctx, lead)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ferr
	}
}

// run calls fn with a context that ends with the lease or with ctx.
func (ls *Lease) run(ctx context.Context, fn func(context.Context, *Lease) error) error {
	fctx, cancel := context.WithCancelCause(ls.Context())
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	return fn(fctx, ls)
}

// resign releases a leadership, bounded by its validity: past it the lease
// has ended anyway.
func resign(ctx context.Context, ls *Lease) {
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), ls.ValidUntil())
	defer cancel()
	_ = ls.Release(rctx)
}
