package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
)

// Lease is a held lock. Its methods are safe for concurrent use.
//
// A lease ends exactly once: when it is released, or when it is lost (it
// expired, was taken over, its session or connection is gone, it could not
// be refreshed before ValidUntil, or the watchdog stopped at its
// Options.MaxHold or HeartbeatTimeout). Done is then closed, Err says why (matching
// ErrReleased or ErrLost, both of which match ErrNotHeld) and Context is
// cancelled with that cause. Loss is signalled no later than ValidUntil.
type Lease struct {
	l        *Locker
	h        driver.Handle
	name     string
	token    string
	kind     driver.Kind
	limit    int
	fence    uint64
	hasFence bool
	opts     Options
	notifier driver.LossNotifier // the handle, when it reports loss
	drift    time.Duration       // from the grant, zero for the default
	since    time.Time           // when the grant's request was sent
	// parts are the one-name leases an AcquireAll lease is made of (see
	// compose); nil for any other lease.
	parts []*Lease
	// beat is when Heartbeat was last called (or the lease granted), in
	// monotonic nanoseconds after since; used with HeartbeatTimeout only.
	beat atomic.Int64

	// ops serialises Refresh, Release and Held on the handle, so that the
	// server sees them in the order their results are applied. It is a
	// one-slot channel rather than a mutex so that a caller waiting behind a
	// request in flight (a watchdog refresh to an unreachable server) gives
	// up when its ctx ends.
	ops chan struct{}

	mu         sync.Mutex
	ttl        time.Duration
	validUntil time.Time
	err        error // why the lease ended, once it has
	// done holds the chan struct{} that Done returns, made by its first
	// call (most leases are released without anyone asking), or
	// closedChan when the lease ended first.
	done atomic.Value
	// refreshStopped is set by Release, and when the watchdog stops for
	// MaxHold or HeartbeatTimeout: the watchdog sends no more.
	refreshStopped bool
	// workStop says why the watchdog stopped before the lease ended, for
	// the loss at ValidUntil: MaxHold or HeartbeatTimeout.
	workStop error
	// parent is the AcquireAll lease this one is a part of, once composed:
	// the part's loss ends it.
	parent *Lease
	retry  backoff.Backoff // the watchdog's delays after failed refreshes

	ctx    context.Context // made by the first call of Context
	cancel context.CancelCauseFunc

	// Background work runs on the locker's scheduler, not on a goroutine or
	// timer of its own: a lease that lives shorter than its refresh interval
	// costs neither.
	deadline      task               // ends the lease at ValidUntil
	tick          task               // the watchdog; run is nil with NoRefresh
	refreshCtx    context.Context    // made by the first watchdog refresh
	cancelRefresh context.CancelFunc // aborts a refresh in flight once the lease ended
}

func newLease(l *Locker, req driver.Request, o Options, g *driver.Grant, sent time.Time) *Lease {
	ls := &Lease{
		l: l, h: g.Handle, name: req.Name, token: req.Token, kind: req.Kind, limit: req.Limit,
		fence: g.Fence, hasFence: l.caps.Fences(req.Kind), opts: o, drift: g.Drift,
		ttl: req.TTL, retry: backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax},
		ops: make(chan struct{}, 1), since: sent,
	}
	if g.TTL > 0 {
		ls.ttl = g.TTL
	}
	ls.notifier, _ = g.Handle.(driver.LossNotifier)
	ls.validUntil = validUntil(sent, req.TTL, g)
	if o.HeartbeatTimeout > 0 {
		ls.Heartbeat() // the grant is the first heartbeat
	}
	return ls
}

// start schedules the lease's timed tasks. The tasks are counted in the locker's background group
// while they run, so Close can wait for them.
func (ls *Lease) start(sent time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.deadline = leaseTask(ls, (*Lease).onDeadline)
	ls.l.sched.schedule(&ls.deadline, ls.validUntil)
	if !ls.opts.NoRefresh {
		ls.tick = leaseTask(ls, (*Lease).onTick)
		ls.scheduleTick(sent)
	}
}

// watchLoss registers the lease's end with a handle that reports loss
// (driver.LossNotifier); the lease must not be locked.
func (ls *Lease) watchLoss() {
	if ls.notifier != nil {
		ls.notifier.OnLost(func() {
			if c, ok := ls.notifier.(driver.LossCauser); ok {
				if cause := c.LossCause(); cause != nil {
					ls.end(fmt.Errorf("%w: %w", ErrLost, cause))
					return
				}
			}
			ls.end(fmt.Errorf("%w: the backend reports %q gone", ErrLost, ls.name))
		})
	}
}

// enter registers a running timed task; it returns false once the lease
// has ended, so no callback starts after that.
func (ls *Lease) enter() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return false
	}
	ls.l.bg.Add(1)
	return true
}

// onDeadline ends the lease when ValidUntil has passed without a refresh.
// The lock may still be the lease's on the server, and a refresh still on
// its way there would extend it for another TTL after the loss was
// reported: with a driver that can remove an attempt's lock (an
// Abandoner), the lease's is removed in the background, token-checked and
// bounded by the TTL, so that what was declared lost is given up.
func (ls *Lease) onDeadline() {
	if !ls.enter() {
		return
	}
	defer ls.l.bg.Done()
	ls.mu.Lock()
	left := time.Until(ls.validUntil)
	if left > 0 { // a refresh moved it meanwhile
		ls.l.sched.schedule(&ls.deadline, ls.validUntil)
	}
	why := ls.workStop
	ls.mu.Unlock()
	if left <= 0 {
		if why != nil {
			ls.end(fmt.Errorf("%w: %q ended at its ValidUntil, the watchdog having stopped: %w", ErrLost, ls.name, why))
		} else {
			ls.end(fmt.Errorf("%w: %q was not refreshed before its ValidUntil", ErrLost, ls.name))
		}
		if ls.l.abandoner != nil && ls.parts == nil { // a whole's parts are given back by end
			ls.mu.Lock()
			ttl := ls.ttl
			ls.mu.Unlock()
			ls.l.abandon(context.Background(), driver.Request{
				Name: ls.name, Token: ls.token, TTL: ttl, Metadata: ls.opts.Metadata, Kind: ls.kind, Limit: ls.limit,
			})
		}
	}
}

// onTick is the watchdog: one refresh bounded by ValidUntil, then the next
// one scheduled (sooner, with backoff, after a failure that did not lose the
// lock). The deadline task runs meanwhile if the refresh hangs.
func (ls *Lease) onTick() {
	if !ls.enter() {
		return
	}
	defer ls.l.bg.Done()
	ls.ops <- struct{}{}
	// The refresh counts as sent when the work's bounds were checked: the
	// lease is then valid no longer than TTL past them.
	sent := time.Now()
	ls.mu.Lock()
	stopped, until, ttl := ls.tickState(sent)
	if !stopped && ls.refreshCtx == nil {
		ls.refreshCtx, ls.cancelRefresh = context.WithCancel(context.Background())
	}
	rctx := ls.refreshCtx
	ls.mu.Unlock()
	if stopped {
		<-ls.ops
		return
	}
	ctx, cancel := context.WithDeadline(rctx, until)
	granted, err := ls.h.Refresh(ctx, ttl)
	err = ls.applyRefresh(sent, ttl, granted, err)
	cancel()
	<-ls.ops
	ls.afterTick(err, until)
}

// tickState is what a watchdog tick at now needs: whether it must send no
// refresh (the lease has ended, was released, or its work's bounds have
// run out: then the watchdog stops for good), the lease's ValidUntil and
// its TTL; ls.mu and ls.ops held.
func (ls *Lease) tickState(now time.Time) (stopped bool, until time.Time, ttl time.Duration) {
	if !ls.refreshStopped && ls.err == nil {
		if why := ls.workLimit(now); why != nil {
			ls.refreshStopped, ls.workStop = true, why
		}
	}
	return ls.refreshStopped || ls.err != nil, ls.validUntil, ls.ttl
}

// workLimit says why no refresh may be sent at now for the lease's work:
// its MaxHold has passed, or its HeartbeatTimeout without a heartbeat; nil
// when one may.
func (ls *Lease) workLimit(now time.Time) error {
	held := now.Sub(ls.since)
	if m := ls.opts.MaxHold; m > 0 && held >= m {
		return fmt.Errorf("%w (%v)", ErrMaxHold, m)
	}
	if h := ls.opts.HeartbeatTimeout; h > 0 {
		if quiet := held - time.Duration(ls.beat.Load()); quiet > h {
			return fmt.Errorf("%w (%v; the last was %v before the watchdog's tick)", ErrHeartbeatTimeout, h, quiet.Round(time.Millisecond))
		}
	}
	return nil
}

// Heartbeat tells the watchdog that the work holding the lease is alive:
// with Options.HeartbeatTimeout, the watchdog refreshes the lease only while
// Heartbeat was called within that timeout (the grant counts as the first
// call). It reads the monotonic clock and stores the reading atomically: no
// I/O, no allocation, no lock, safe from any goroutine and cheap enough for
// a hot loop. Once the watchdog has stopped for a missed heartbeat, a late
// one changes nothing: the lease ends at its ValidUntil. Without
// HeartbeatTimeout it does nothing.
func (ls *Lease) Heartbeat() {
	if ls.opts.HeartbeatTimeout > 0 {
		ls.beat.Store(int64(time.Since(ls.since)))
	}
}

// afterTick handles the outcome of a watchdog refresh whose lease was valid
// until until: a failure that did not lose the lock is reported and the
// refresh tried again sooner, with backoff.
func (ls *Lease) afterTick(err error, until time.Time) {
	if err == nil || errors.Is(err, ErrNotHeld) {
		return // refresh rescheduled the tick, or the lease has ended
	}
	if o := ls.l.obs.Load(); o != nil && ls.Err() == nil {
		o.emit(Event{Kind: EventRefreshFailed, Context: context.Background(), Name: ls.name, Fence: ls.fence, ValidUntil: until, Err: err})
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err == nil && !ls.refreshStopped {
		// With slack, the leases of a batch that failed as a whole try
		// again together, not one request each.
		d := ls.retry.Next()
		ls.l.sched.scheduleSlack(&ls.tick, time.Now().Add(d), ls.slack(d/2))
	}
}

// Name is the lock's name; for a lease from AcquireAll, its names (Names)
// joined by commas.
func (ls *Lease) Name() string { return ls.name }

// isPart reports whether the lease is a part of an AcquireAll lease.
func (ls *Lease) isPart() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.parent != nil
}

// Token is the owner token: 128 random bits, unique to this lease, stored on
// the server as the lock's value where the backend has one.
func (ls *Lease) Token() string { return ls.token }

// Fence returns the fencing token and true when the backend makes them: a
// number that strictly increases with every grant of the same name, across
// holders and takeovers. Pass it to the resource the lock protects so that it
// can refuse writes from a holder whose lease has ended. A lease from
// AcquireAll has one per name: see Fences.
func (ls *Lease) Fence() (uint64, bool) { return ls.fence, ls.hasFence }

// ValidUntil is a conservative local deadline, on the monotonic clock, before
// which no one else can hold the lock: measured from when the last successful
// acquire or refresh request was sent, plus the granted TTL, minus a clock
// drift margin. Compare it with time.Now(), not with wall-clock times from
// elsewhere.
func (ls *Lease) ValidUntil() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.validUntil
}

// TTL is the lifetime the server granted at the last acquire or refresh.
func (ls *Lease) TTL() time.Duration {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ttl
}

// Done is closed when the lease ends, released or lost.
func (ls *Lease) Done() <-chan struct{} {
	if d := ls.done.Load(); d != nil {
		return d.(chan struct{})
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	d := ls.done.Load()
	if d == nil {
		d = make(chan struct{})
		if ls.err != nil {
			d = closedChan
		}
		ls.done.Store(d)
	}
	return d.(chan struct{})
}

// closedChan is a closed channel: Done's after the lease ended.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Err is nil while the lease is held; after Done is closed it says why it
// ended, matching ErrReleased or ErrLost (and so ErrNotHeld).
func (ls *Lease) Err() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// Context is cancelled when the lease ends, with Err as its cause: bind work
// that must stop when the lock is lost to it.
func (ls *Lease) Context() context.Context {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx == nil {
		ls.ctx, ls.cancel = context.WithCancelCause(context.Background())
		if ls.err != nil {
			ls.cancel(ls.err)
		}
	}
	return ls.ctx
}

// Refresh extends the lock to ttl from now (zero: the lease's TTL) and moves
// ValidUntil. It fails with an error matching ErrNotHeld when the lease has
// ended or the server no longer has the lock for it; then the lease ends as
// lost. Other errors (a timeout, a connection reset) leave the lease as it
// was: it stays valid until ValidUntil. Once the lease's Options.MaxHold has
// passed, Refresh sends nothing and returns an error matching ErrMaxHold.
// ctx bounds the request.
func (ls *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = ls.TTL()
	}
	o := ls.opts
	o.TTL = ttl
	if ttl > 0 && o.RefreshInterval >= ttl {
		o.RefreshInterval = ttl / 3
	}
	if err := o.validate(ls.l.caps); err != nil {
		return err
	}
	if err := ls.lockOps(ctx); err != nil {
		return fmt.Errorf("dlock: refresh of %q: %w", ls.name, err)
	}
	defer ls.unlockOps()
	if err := ls.Err(); err != nil {
		return err
	}
	if m := ls.opts.MaxHold; m > 0 && time.Since(ls.since) >= m {
		return fmt.Errorf("dlock: refresh of %q: %w (%v)", ls.name, ErrMaxHold, m)
	}
	return ls.refresh(ctx, ttl)
}

// lockOps takes ls.ops, waiting for a request in flight at most until ctx
// ends.
func (ls *Lease) lockOps(ctx context.Context) error {
	select {
	case ls.ops <- struct{}{}:
		return nil
	default:
	}
	select {
	case ls.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ls *Lease) unlockOps() { <-ls.ops }

// refresh sends one refresh; ls.ops is held.
func (ls *Lease) refresh(ctx context.Context, ttl time.Duration) error {
	sent := time.Now()
	granted, err := ls.h.Refresh(ctx, ttl)
	return ls.applyRefresh(sent, ttl, granted, err)
}

// applyRefresh applies the outcome of a refresh of ttl sent at sent; ls.ops
// is held.
func (ls *Lease) applyRefresh(sent time.Time, ttl, granted time.Duration, err error) error {
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			err = fmt.Errorf("%w: refresh of %q: %w", ErrLost, ls.name, err)
			ls.end(err)
			return err
		}
		return fmt.Errorf("dlock: refresh of %q: %w", ls.name, err)
	}
	if granted <= 0 {
		granted = ttl
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return ls.err
	}
	ls.ttl = granted
	ls.validUntil = validUntil(sent, ttl, &driver.Grant{TTL: granted, Drift: ls.drift})
	ls.l.sched.schedule(&ls.deadline, ls.validUntil)
	ls.retry.Reset()
	if ls.tick.run != nil && !ls.refreshStopped {
		ls.scheduleTick(sent)
	}
	return nil
}

// scheduleTick schedules the watchdog's next refresh an interval after
// sent, which may run up to a tenth of the interval early with others in a
// batch; ls.mu held or not yet shared.
func (ls *Lease) scheduleTick(sent time.Time) {
	iv := ls.interval()
	ls.l.sched.scheduleSlack(&ls.tick, sent.Add(iv), ls.slack(iv/10))
}

// slack is how much earlier than due the watchdog's tick may run in a
// batch: d, or none for an AcquireAll lease, which is never in a batch
// (its handle is no driver's: it batches its parts itself).
func (ls *Lease) slack(d time.Duration) time.Duration {
	if ls.parts != nil {
		return 0
	}
	return d
}

// interval is the watchdog period for the current TTL; ls.mu held or not yet
// shared.
func (ls *Lease) interval() time.Duration {
	if ls.opts.RefreshInterval > 0 && ls.opts.RefreshInterval < ls.ttl {
		return ls.opts.RefreshInterval
	}
	return ls.ttl / 3
}

// Release removes the lock if it is still this lease's, after stopping the
// watchdog. It is idempotent: after a successful release it returns nil
// again. It returns an error matching ErrNotHeld when the lease had been
// lost or taken over, and never removes another holder's lock. A failed
// request (timeout, connection error) can be retried; the lease stays valid
// until ValidUntil meanwhile. ctx bounds the request.
func (ls *Lease) Release(ctx context.Context) error {
	// Stop the watchdog first. A refresh in flight holds ops: taking it
	// waits for that refresh to finish rather than cancelling it (some
	// clients drop the connection, and with it the lock, on cancellation);
	// it is bounded by ValidUntil, and the wait by ctx.
	ls.mu.Lock()
	ls.refreshStopped = true
	if ls.tick.run != nil {
		ls.l.sched.cancel(&ls.tick)
	}
	ls.mu.Unlock()
	if err := ls.lockOps(ctx); err != nil {
		return fmt.Errorf("dlock: release of %q: %w", ls.name, err)
	}
	defer ls.unlockOps()
	if err := ls.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			return nil
		}
		return err
	}
	o := ls.l.obs.Load()
	if ls.isPart() {
		o = nil // the whole lease reports
	}
	var start time.Time
	if o != nil {
		start = time.Now()
	}
	if err := ls.h.Release(ctx); err != nil {
		if errors.Is(err, ErrNotHeld) {
			err = fmt.Errorf("%w: release of %q: %w", ErrLost, ls.name, err)
			ls.end(err)
			return err
		}
		return fmt.Errorf("dlock: release of %q: %w", ls.name, err)
	}
	ls.end(ErrReleased)
	if o != nil {
		now := time.Now()
		o.emit(Event{Kind: EventReleased, Context: ctx, Name: ls.name, Duration: now.Sub(start), Held: now.Sub(ls.since), Fence: ls.fence})
	}
	return nil
}

// Held asks the server whether the lock is still this lease's. A lease that has ended answers false without a request. When
// the server says no, the lease ends as lost. ctx bounds the request.
func (ls *Lease) Held(ctx context.Context) (bool, error) {
	if ls.Err() != nil {
		return false, nil
	}
	if err := ls.lockOps(ctx); err != nil {
		return false, fmt.Errorf("dlock: checking %q: %w", ls.name, err)
	}
	defer ls.unlockOps()
	if ls.Err() != nil {
		return false, nil
	}
	ok, err := ls.h.Held(ctx)
	if err != nil {
		return false, fmt.Errorf("dlock: checking %q: %w", ls.name, err)
	}
	if !ok {
		ls.end(fmt.Errorf("%w: the server no longer has %q for this lease", ErrLost, ls.name))
	}
	return ok, nil
}

// end ends the lease once, with err as the reason.
func (ls *Lease) end(err error) {
	ls.mu.Lock()
	if ls.err != nil {
		ls.mu.Unlock()
		return
	}
	if ls.workStop != nil && errors.Is(err, ErrLost) && !errors.Is(err, ls.workStop) {
		// Lost after the watchdog stopped for MaxHold or HeartbeatTimeout:
		// that is why, whoever reported it first. A backend that ends a
		// silent holder's lock itself (postgres's idle_session_timeout)
		// can report it before the ValidUntil timer runs on a loaded
		// machine (busy run 11).
		err = fmt.Errorf("%w (the watchdog had stopped: %w)", err, ls.workStop)
	}
	ls.err = err
	// Cancel the context before closing Done, so that whoever sees Done
	// closed also finds Context cancelled. (Cancelling only cancels child
	// contexts; AfterFunc callbacks run in goroutines of their own.)
	if ls.cancel != nil {
		ls.cancel(err)
	}
	if d, _ := ls.done.Load().(chan struct{}); d != nil {
		close(d)
	} else {
		ls.done.Store(closedChan)
	}
	ls.l.sched.cancel(&ls.deadline)
	if ls.tick.run != nil {
		ls.l.sched.cancel(&ls.tick)
	}
	cancelRefresh, parent := ls.cancelRefresh, ls.parent
	ls.mu.Unlock()
	if cancelRefresh != nil {
		cancelRefresh()
	}
	ls.l.forget(ls)
	if ls.parts != nil {
		ls.endParts(err)
	}
	if parent != nil {
		if !errors.Is(err, ErrReleased) {
			parent.end(err) // the part's error names it
		}
		return // the whole lease reports
	}
	if o := ls.l.obs.Load(); o != nil && !errors.Is(err, ErrReleased) {
		o.emit(Event{Kind: EventLost, Context: context.Background(), Name: ls.name, Held: time.Since(ls.since), Fence: ls.fence, Err: err})
	}
}
