package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lease is a held lock. Its methods are safe for concurrent use.
//
// A lease ends exactly once: when it is released, or when it is lost (it
// expired, was taken over, its session or connection is gone, or it could not
// be refreshed before ValidUntil). Done is then closed, Err says why (matching
// ErrReleased or ErrLost, both of which match ErrNotHeld) and Context is
// cancelled with that cause. Loss is signalled no later than ValidUntil.
type Lease struct {
	l        *locker
	h        Handle
	name     string
	token    string
	fence    uint64
	hasFence bool
	opts     Options
	lost     <-chan struct{} // the driver's loss signal, may be nil
	drift    time.Duration   // from the grant, zero for the default

	// ops serialises Refresh, Release and Held on the handle, so that the
	// server sees them in the order their results are applied.
	ops sync.Mutex

	mu          sync.Mutex
	ttl         time.Duration
	validUntil  time.Time
	nextRefresh time.Time
	err         error // why the lease ended, once it has
	done        chan struct{}

	ctx    context.Context
	cancel context.CancelCauseFunc

	kick          chan struct{}      // validUntil or nextRefresh changed
	quiesce       chan struct{}      // closed by Release: refresh no more
	quiesced      chan struct{}      // closed by the monitor in answer
	quiesceOnce   sync.Once          //
	cancelRefresh context.CancelFunc // aborts a refresh in flight once the lease ended
	refreshCtx    context.Context
	monitorDone   chan struct{}
}

func newLease(l *locker, req Request, o Options, g *Grant, sent time.Time) *Lease {
	ls := &Lease{
		l: l, h: g.Handle, name: req.Name, token: req.Token,
		fence: g.Fence, hasFence: l.caps.Fencing, opts: o, lost: g.Lost, drift: g.Drift,
		ttl:  req.TTL,
		done: make(chan struct{}), kick: make(chan struct{}, 1),
		quiesce: make(chan struct{}), quiesced: make(chan struct{}), monitorDone: make(chan struct{}),
	}
	if g.TTL > 0 {
		ls.ttl = g.TTL
	}
	ls.validUntil = validUntil(sent, req.TTL, g)
	ls.nextRefresh = sent.Add(ls.interval())
	ls.ctx, ls.cancel = context.WithCancelCause(context.Background())
	ls.refreshCtx, ls.cancelRefresh = context.WithCancel(context.Background())
	return ls
}

// Name is the lock's name.
func (ls *Lease) Name() string { return ls.name }

// Token is the owner token: 128 random bits, unique to this lease, stored on
// the server as the lock's value where the backend has one.
func (ls *Lease) Token() string { return ls.token }

// Fence returns the fencing token and true when the backend makes them: a
// number that strictly increases with every grant of the same name, across
// holders and takeovers. Pass it to the resource the lock protects so that it
// can refuse writes from a holder whose lease has ended.
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
func (ls *Lease) Done() <-chan struct{} { return ls.done }

// Err is nil while the lease is held; after Done is closed it says why it
// ended, matching ErrReleased or ErrLost (and so ErrNotHeld).
func (ls *Lease) Err() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// Context is cancelled when the lease ends, with Err as its cause: bind work
// that must stop when the lock is lost to it.
func (ls *Lease) Context() context.Context { return ls.ctx }

// Refresh extends the lock to ttl from now (zero: the lease's TTL) and moves
// ValidUntil. It fails with an error matching ErrNotHeld when the lease has
// ended or the server no longer has the lock for it; then the lease ends as
// lost. Other errors (a timeout, a connection reset) leave the lease as it
// was: it stays valid until ValidUntil. ctx bounds the request.
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
	ls.ops.Lock()
	defer ls.ops.Unlock()
	if err := ls.Err(); err != nil {
		return err
	}
	return ls.refresh(ctx, ttl)
}

// refresh sends one refresh; ls.ops is held.
func (ls *Lease) refresh(ctx context.Context, ttl time.Duration) error {
	sent := time.Now()
	granted, err := ls.h.Refresh(ctx, ttl)
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
	if ls.err == nil {
		ls.ttl = granted
		ls.validUntil = validUntil(sent, ttl, &Grant{TTL: granted, Drift: ls.drift})
		ls.nextRefresh = sent.Add(ls.interval())
	}
	err = ls.err
	ls.mu.Unlock()
	select {
	case ls.kick <- struct{}{}:
	default:
	}
	return err
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
	// Stop the watchdog and wait for a refresh in flight to finish (not
	// cancel it: some clients drop the connection, and with it the lock, on
	// cancellation). It is bounded by ValidUntil.
	ls.quiesceOnce.Do(func() { close(ls.quiesce) })
	select {
	case <-ls.quiesced:
	case <-ls.monitorDone:
	}
	ls.ops.Lock()
	defer ls.ops.Unlock()
	if err := ls.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			return nil
		}
		return err
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
	<-ls.monitorDone
	return nil
}

// Held asks the server whether the lock is still this lease's (the seeds'
// isLocking). A lease that has ended answers false without a request. When
// the server says no, the lease ends as lost. ctx bounds the request.
func (ls *Lease) Held(ctx context.Context) (bool, error) {
	if ls.Err() != nil {
		return false, nil
	}
	ls.ops.Lock()
	defer ls.ops.Unlock()
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
	ls.err = err
	close(ls.done)
	ls.mu.Unlock()
	ls.cancel(err)
	ls.cancelRefresh()
	ls.l.forget(ls)
}

// monitor is the lease's one goroutine: it refreshes (unless NoRefresh),
// watches the driver's loss signal and ends the lease at ValidUntil if no
// refresh moved it. A refresh runs in its own goroutine so that a request
// stuck in the network cannot delay the loss signal. It returns when the
// lease ends and that refresh has returned.
func (ls *Lease) monitor() {
	defer close(ls.monitorDone)
	refreshing := !ls.opts.NoRefresh
	quiesce := ls.quiesce
	quiescePending := false
	var inflight chan error // non-nil while a refresh runs
	backoff := ls.opts.RetryMin
	deadline := time.NewTimer(time.Hour)
	tick := time.NewTimer(time.Hour)
	defer deadline.Stop()
	defer tick.Stop()
	finish := func(reason error) {
		if reason != nil {
			ls.end(reason)
		}
		if inflight != nil {
			<-inflight
		}
	}
	for {
		ls.mu.Lock()
		until, next := ls.validUntil, ls.nextRefresh
		ls.mu.Unlock()
		deadline.Reset(time.Until(until))
		var tickC <-chan time.Time
		if refreshing && inflight == nil {
			tick.Reset(time.Until(next))
			tickC = tick.C
		}
		select {
		case <-ls.done:
			finish(nil)
			return
		case <-quiesce:
			refreshing, quiesce = false, nil
			if inflight == nil {
				close(ls.quiesced)
			} else {
				quiescePending = true
			}
		case <-ls.kick:
		case <-ls.lost:
			finish(fmt.Errorf("%w: the backend reports %q gone", ErrLost, ls.name))
			return
		case <-deadline.C:
			finish(fmt.Errorf("%w: %q was not refreshed before its ValidUntil", ErrLost, ls.name))
			return
		case err := <-inflight:
			inflight = nil
			if quiescePending {
				close(ls.quiesced)
				quiescePending = false
			}
			if err != nil && !errors.Is(err, ErrNotHeld) {
				// Not lost (yet): try again soon; the deadline still stands.
				ls.mu.Lock()
				ls.nextRefresh = time.Now().Add(jitter(backoff))
				ls.mu.Unlock()
				backoff = min(2*backoff, ls.opts.RetryMax)
			} else {
				backoff = ls.opts.RetryMin
			}
		case <-tickC:
			inflight = make(chan error, 1)
			go func(c chan<- error) { c <- ls.watchdogRefresh(until) }(inflight)
		}
		deadline.Stop()
		tick.Stop()
	}
}

// watchdogRefresh sends one refresh bounded by the validity deadline.
func (ls *Lease) watchdogRefresh(until time.Time) error {
	ctx, cancel := context.WithDeadline(ls.refreshCtx, until)
	defer cancel()
	ls.ops.Lock()
	defer ls.ops.Unlock()
	if ls.Err() != nil || ls.refreshCtx.Err() != nil {
		return nil
	}
	return ls.refresh(ctx, ls.TTL())
}
