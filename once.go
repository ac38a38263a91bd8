package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
)

// DefaultRetention is how long the record of a completed slot is kept when
// OnceOptions.Retention is zero.
const DefaultRetention = 24 * time.Hour

var (
	// ErrAlreadyDone: Once found the slot's run completed already, on this
	// host or another; fn did not run.
	ErrAlreadyDone = errors.New("dlock: the slot's run has completed already")

	// ErrAttemptsExhausted: Once found that runs of the slot failed
	// OnceOptions.MaxAttempts times already; fn did not run.
	ErrAttemptsExhausted = errors.New("dlock: the slot's runs failed as often as allowed")
)

// OnceOptions control Once. A nil *OnceOptions means the defaults.
type OnceOptions struct {
	// Lock are the options of the slot's lock (TTL, refresh, MaxHold…).
	// Default nil: the Locker's defaults.
	Lock *Options

	// Retention is how long the backend keeps the record of a completed
	// slot (and of failed attempts, with MaxAttempts). Within it, no host
	// runs the slot again; past it, the slot is forgotten. It must exceed
	// the latest any host may try the slot after it completed: the clock
	// difference between hosts plus their scheduling delay. Default
	// DefaultRetention (24h).
	Retention time.Duration

	// MaxAttempts bounds the failed runs of a slot (fn returned an error
	// while the lease held): once that many failures are recorded, Once
	// returns ErrAttemptsExhausted without running fn. A run whose lease
	// was lost cannot record anything and is not counted. Default 0: no
	// bound, a failed slot is tried again by whoever calls Once for it.
	MaxAttempts int

	// NoWait makes Once return an error matching ErrNotAcquired at once
	// when another host holds the slot's lock (running it), instead of
	// waiting for that run to end and then finding it done (or, if it
	// failed, running the slot). Default false: wait until ctx ends.
	NoWait bool
}

// Slot returns the schedule slot of a job run every period, as seen at t:
// the boundary nearest t, in RFC 3339 (UTC, with fractional seconds when
// period has them), such as "2026-11-28T03:00:00Z". Boundaries are the
// multiples of period counted from 00:00 UTC on January 1 of year 1: whole
// minutes, hours, UTC midnights for a day, Mondays for a week.
//
// Hosts that try the job at (or near) a boundary, each by its own clock,
// name the same slot as long as their clocks and scheduling delays differ
// by less than period/2 in all. A schedule far from the boundaries (daily
// at 12:00 UTC is half a day from both midnights, and hosts a moment apart
// would name two days) names its slots by its own offset:
// Slot(t.Add(-12*time.Hour), 24*time.Hour). Slot returns "" for a period
// that is not positive (Once refuses an empty slot).
func Slot(t time.Time, period time.Duration) string {
	if period <= 0 {
		return ""
	}
	return t.UTC().Round(period).Format(time.RFC3339Nano)
}

// OnceName is the name of the lock Once takes for job's slot:
// "once/<job>/<slot>". Its record (see driver.Recorder) is the slot's.
func OnceName(job, slot string) string { return "once/" + job + "/" + slot }

// Once runs fn for job's schedule slot (see Slot) exactly once across the
// hosts that call it with the same job and slot: at most one at a time, and
// not again once a run completed.
//
//   - fn runs under the lock OnceName(job, slot), with a context that ends
//     when the lease does (lost) or when ctx ends.
//   - When fn returns nil with the lease still held, the slot's completion
//     is recorded on the backend, in the same step as a check that the
//     lease still holds the lock (a holder that lost it writes nothing),
//     kept for OnceOptions.Retention. Later calls for the slot, on any
//     host, return an error matching ErrAlreadyDone without running fn,
//     and so does a caller that waited for that run.
//   - When fn returns an error, Once returns it and the slot stays open: the
//     next caller (or one waiting) runs it again, up to
//     OnceOptions.MaxAttempts failures if set.
//   - When the lease is lost while fn runs (or before its completion is
//     recorded), Once returns an error matching ErrLost: the completion is
//     not recorded, and the slot may run again on another host. fn must
//     therefore stop when its context ends, and make its effects safe to
//     repeat or fenced (see package fence) against a run that outlives its
//     lease.
//
// ctx bounds the wait for another host's run (an error matching
// ErrNotAcquired and ctx.Err() when it ends first) and fn (whose context
// ends with it); a completion is recorded even when ctx ended as fn
// returned nil, bounded by the lease's validity, and a run cut short by
// ctx is not counted as a failed attempt. Bad input (nil fn or ctx, an
// empty job or slot, a slot with '/', an invalid lock name or options) is
// ErrInvalid before any I/O; a backend that keeps no records
// (Capabilities.Records) gives errors.ErrUnsupported.
func (l *Locker) Once(ctx context.Context, job, slot string, opts *OnceOptions, fn func(ctx context.Context, lease *Lease) error) error {
	var o OnceOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case ctx == nil:
		return invalid("nil context")
	case fn == nil:
		return invalid("nil function")
	case job == "":
		return invalid("empty job")
	case slot == "":
		return invalid("empty slot")
	case strings.Contains(slot, "/"):
		return invalid("slot %q contains '/'", slot)
	case o.Retention < 0:
		return invalid("negative retention %v", o.Retention)
	case o.MaxAttempts < 0:
		return invalid("negative MaxAttempts %d", o.MaxAttempts)
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	name := OnceName(job, slot)
	if err := ValidateName(name); err != nil {
		return err
	}
	lo, err := o.Lock.resolve(l.defaults, l.caps)
	if err != nil {
		return err
	}
	rec, ok := l.d.(driver.Recorder)
	if !ok || !l.caps.Records {
		return fmt.Errorf("dlock: Once: the backend keeps no records (Capabilities.Records): %w", errors.ErrUnsupported)
	}

	// A slot done already needs no wait for its lock.
	if _, err := l.slotState(ctx, rec, name, o); err != nil {
		return err
	}
	var ls *Lease
	if o.NoWait {
		ls, err = l.TryAcquire(ctx, name, o.Lock)
	} else {
		ls, err = l.Acquire(ctx, name, o.Lock)
	}
	if err != nil {
		return err
	}
	defer resign(ctx, ls)
	// Under the lock: a run that completed while this one waited, or a
	// run past the attempts allowed.
	failed, err := l.slotState(ctx, rec, name, o)
	if err != nil {
		return err
	}
	ferr := ls.run(ctx, fn)
	if ls.Err() != nil {
		return errors.Join(fmt.Errorf("dlock: Once %q: the lease ended while fn ran, so its outcome is not recorded and the slot may run again: %w", name, ls.Err()), ferr)
	}
	if ferr != nil {
		if o.MaxAttempts > 0 && ctx.Err() == nil {
			// Best effort: a failure not counted allows one more attempt.
			_ = ls.record(ctx, rec, encodeFailed(failed+1, time.Now()), o.Retention, lo)
		}
		return ferr
	}
	if err := ls.record(ctx, rec, encodeDone(time.Now(), ls), o.Retention, lo); err != nil {
		return fmt.Errorf("dlock: Once %q: fn completed, but its completion could not be recorded, so the slot may run again: %w", name, err)
	}
	return nil
}

// slotState reads the slot's record: an error matching ErrAlreadyDone or
// ErrAttemptsExhausted when Once must not run it, else the failed attempts
// recorded.
func (l *Locker) slotState(ctx context.Context, rec driver.Recorder, name string, o OnceOptions) (failed int, err error) {
	v, ok, err := rec.Recorded(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("dlock: Once %q: reading its record: %w", name, err)
	}
	if !ok {
		return 0, nil
	}
	if n, at, ok := decodeFailed(v); ok {
		if o.MaxAttempts > 0 && n >= o.MaxAttempts {
			return n, fmt.Errorf("%w: %q: %d failed runs, the last at %s", ErrAttemptsExhausted, name, n, at)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: %q (%s)", ErrAlreadyDone, name, v)
}

// record writes the lease's record, conditional on the lease holding its
// lock, trying again after errors other than ErrNotHeld until the lease's
// ValidUntil.
func (ls *Lease) record(ctx context.Context, rec driver.Recorder, value string, retention time.Duration, o Options) error {
	// The run is over: its outcome is recorded even if ctx ended meanwhile.
	ctx = context.WithoutCancel(ctx)
	retry := backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax}
	for {
		err := ls.recordOnce(ctx, rec, value, retention)
		if err == nil || errors.Is(err, ErrNotHeld) {
			return err
		}
		if ls.Err() != nil {
			return errors.Join(err, ls.Err())
		}
		rctx, cancel := context.WithDeadline(ctx, ls.ValidUntil())
		ok := retry.Sleep(rctx)
		cancel()
		if !ok {
			if !time.Now().Before(ls.ValidUntil()) { // the lease ends now, if it has not
				return errors.Join(err, fmt.Errorf("%w: %q reached its ValidUntil while recording", ErrLost, ls.name))
			}
			return err
		}
	}
}

// recordOnce makes one Record of the lease's handle, bounded by ValidUntil,
// serialised with the lease's other operations on it.
func (ls *Lease) recordOnce(ctx context.Context, rec driver.Recorder, value string, retention time.Duration) error {
	if err := ls.Err(); err != nil {
		return err
	}
	rctx, cancel := context.WithDeadline(ctx, ls.ValidUntil())
	defer cancel()
	if err := ls.lockOps(rctx); err != nil {
		return fmt.Errorf("dlock: recording %q: %w", ls.name, err)
	}
	defer ls.unlockOps()
	if err := ls.Err(); err != nil {
		return err
	}
	err := rec.Record(rctx, ls.h, value, retention)
	if errors.Is(err, ErrNotHeld) {
		ls.end(fmt.Errorf("%w: the server no longer has %q for this lease (found recording)", ErrLost, ls.name))
	}
	return err
}

// The record's values: "done <RFC 3339 time> fence=<n>" (fence=- without
// fencing) for a completed slot, "failed <n> <RFC 3339 time>" for n failed
// runs, the last at the time. Anything else counts as done.
func encodeDone(at time.Time, ls *Lease) string {
	f := "-"
	if n, ok := ls.Fence(); ok {
		f = strconv.FormatUint(n, 10)
	}
	return "done " + at.UTC().Format(time.RFC3339Nano) + " fence=" + f
}

func encodeFailed(n int, at time.Time) string {
	return "failed " + strconv.Itoa(n) + " " + at.UTC().Format(time.RFC3339Nano)
}

func decodeFailed(v string) (n int, at string, ok bool) {
	f := strings.Fields(v)
	if len(f) != 3 || f[0] != "failed" {
		return 0, "", false
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, f[2], true
}
