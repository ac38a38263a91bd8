// One file, over 600 lines: Locker is the engine every driver shares —
// acquire, wait (poll, watch or the server's queue), validity, abandoning
// a failed attempt, and Close — and these steps hand each other the same
// request and grant; lease.go holds what happens after the grant.

package dlock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
)

// New returns the Locker for a driver. defaults (nil for the package
// defaults) apply to every acquisition whose Options leave a field zero.
func New(d driver.Driver, defaults *Options) (*Locker, error) {
	if d == nil {
		return nil, invalid("nil driver")
	}
	caps := d.Capabilities()
	if _, err := defaults.resolve(nil, caps); err != nil {
		return nil, err
	}
	l := &Locker{d: d, caps: caps, leases: make(map[*Lease]struct{})}
	if defaults != nil {
		cp := *defaults
		l.defaults = &cp
	}
	l.waiter, _ = d.(driver.Waiter)
	l.abandoner, _ = d.(driver.Abandoner)
	l.notifier, _ = d.(driver.Notifier)
	l.waitNotifier, _ = d.(driver.WaitNotifier)
	if _, ok := d.(driver.BatchRefresher); ok {
		l.sched.batch = l.refreshBatch
	}
	l.waits = make(map[context.Context]context.CancelCauseFunc)
	l.closing, l.cancelClosing = context.WithCancelCause(context.Background())
	return l, nil
}

// Locker takes named locks on one backend. It is safe for concurrent use.
// Build one with Open (from a URL) or a driver's New (from a client the
// application owns), and Close it when done.
type Locker struct {
	d            driver.Driver
	caps         Capabilities
	defaults     *Options
	waiter       driver.Waiter
	notifier     driver.Notifier
	waitNotifier driver.WaitNotifier
	abandoner    driver.Abandoner

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup                              // acquisitions under way
	waits    map[context.Context]context.CancelCauseFunc // their contexts, which Close cancels
	// closing ends, with ErrClosed, at Close: the context of acquisitions
	// whose ctx is context.Background() or context.TODO()
	closing       context.Context
	cancelClosing context.CancelCauseFunc
	leases        map[*Lease]struct{}
	bg            sync.WaitGroup // leases' timed tasks while they run, abandons
	abandons      atomic.Int64   // abandons under way, for Close's error
	sched         sched          // the leases' timed work
	obs           atomic.Pointer[Observer]
}

// Capabilities describes the backend: fencing, FIFO waiting, minimum TTL and
// the rest (see Capabilities).
func (l *Locker) Capabilities() Capabilities { return l.caps }

// Acquire waits until the named lock is held or ctx ends. When ctx ends
// first the error matches both ErrNotAcquired and ctx.Err(), and no waiter
// state is left behind. ctx bounds the wait only, not the lease.
func (l *Locker) Acquire(ctx context.Context, name string, opts *Options) (*Lease, error) {
	return l.acquire(ctx, object{name: name}, opts, true)
}

// TryAcquire makes exactly one attempt; it returns an error matching
// ErrNotAcquired if someone else holds the lock, and ErrGrantExpired if the
// lock was granted but the grant took longer than its TTL allows to arrive.
// ctx bounds the attempt.
func (l *Locker) TryAcquire(ctx context.Context, name string, opts *Options) (*Lease, error) {
	return l.acquire(ctx, object{name: name}, opts, false)
}

// object is what an acquisition takes: a lock, a semaphore's permit or a
// side of a read/write lock. Its name has been validated, except a lock's.
type object struct {
	name  string
	kind  driver.Kind
	limit int
	steal bool // taken over from its holder (Locker.Steal), not acquired
}

func (l *Locker) acquire(ctx context.Context, obj object, opts *Options, wait bool) (*Lease, error) {
	if ctx == nil {
		return nil, invalid("nil context")
	}
	name := obj.name
	if obj.kind == driver.KindLock {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
	}
	o, err := opts.resolve(l.defaults, l.caps)
	if err != nil {
		return nil, err
	}
	return l.observed(ctx, name, func() (*Lease, error) { return l.acquireValid(ctx, obj, o, wait) })
}

// observed runs an acquisition of valid input and reports it to the
// Observer, if any.
func (l *Locker) observed(ctx context.Context, name string, acquire func() (*Lease, error)) (*Lease, error) {
	obs := l.obs.Load()
	var start time.Time
	if obs != nil {
		start = time.Now()
	}
	ls, err := acquire()
	if obs != nil && !errors.Is(err, ErrInvalid) {
		ev := Event{Kind: EventAcquired, Context: ctx, Name: name, Duration: time.Since(start), Err: err}
		if err != nil {
			ev.Kind = EventAcquireFailed
		} else {
			ev.Fence, ev.ValidUntil = ls.fence, ls.ValidUntil()
		}
		obs.emit(ev)
	}
	return ls, err
}

// acquireValid is acquire once the input is valid.
func (l *Locker) acquireValid(ctx context.Context, obj object, o Options, wait bool) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, joinLine(ErrNotAcquired, err)
	}
	// actx ends with ctx, or when Close cancels it with ErrClosed. A ctx
	// that never ends and carries nothing needs no context of its own: the
	// Locker's closing serves.
	actx, cancel := l.closing, context.CancelCauseFunc(nil)
	if ctx != context.Background() && ctx != context.TODO() {
		actx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.inflight.Add(1)
	if cancel != nil {
		l.waits[actx] = cancel
	}
	l.mu.Unlock()
	defer func() {
		if cancel != nil {
			l.mu.Lock()
			delete(l.waits, actx)
			l.mu.Unlock()
		}
		l.inflight.Done()
	}()

	req := driver.Request{Name: obj.name, Token: newToken(), TTL: o.TTL, Metadata: o.Metadata, Kind: obj.kind, Limit: obj.limit}
	var (
		g    *driver.Grant
		sent time.Time
		err  error
	)
	switch {
	case obj.steal:
		g, sent, err = l.stealAttempt(actx, req)
	case !wait:
		g, sent, err = l.attempt(actx, req)
	case l.waiter != nil:
		g, sent, err = l.queue(actx, &req, o)
	default:
		g, sent, err = l.poll(actx, &req, o)
	}
	if err != nil {
		return nil, waitError(ctx, actx, err)
	}
	return l.newLease(req, o, g, sent)
}

// waitError shapes the error of an acquisition that ended without a grant.
func waitError(ctx, actx context.Context, err error) error {
	ended := ctxEnded(ctx)
	switch {
	case ended == nil && errors.Is(context.Cause(actx), ErrClosed):
		return joinLine(ErrNotAcquired, ErrClosed)
	case ended != nil:
		if errors.Is(err, ended) && errors.Is(err, ErrNotAcquired) {
			return joinLine(err)
		}
		return joinLine(ErrNotAcquired, ended, err)
	}
	return joinLine(err)
}

// ctxEnded is ctx.Err(), or context.DeadlineExceeded once ctx's deadline
// has passed: a client that was handed the deadline (a dial, a socket's
// deadline, a server told of it) may fail with its own timeout before ctx's
// timer has fired, on a loaded machine.
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// queue is the waiting for drivers whose backend queues waiters: one
// Waiter.Acquire, and when the grant arrives already expired (given back by
// checkValidity), another one with a new token after a backoff, until ctx
// ends.
func (l *Locker) queue(ctx context.Context, req *driver.Request, o Options) (*driver.Grant, time.Time, error) {
	retry := backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax}
	var expired error
	for first := true; ; first = false {
		if !first {
			req.Token = newToken()
		}
		sent := time.Now()
		g, err := l.waiter.Acquire(ctx, *req)
		if err == nil {
			if sent, err = l.checkValidity(ctx, *req, g, sent); err == nil {
				return g, sent, nil
			}
		}
		if !errors.Is(err, ErrGrantExpired) {
			if expired != nil {
				err = joinLine(err, expired)
			}
			return nil, sent, err
		}
		expired = err
		if !retry.Sleep(ctx) {
			return nil, sent, joinLine(ErrNotAcquired, expired)
		}
	}
}

// attempt makes one TryAcquire and checks that the grant is still valid
// once the reply is in: a grant that took longer than its validity is given
// back and reported with ErrGrantExpired.
func (l *Locker) attempt(ctx context.Context, req driver.Request) (*driver.Grant, time.Time, error) {
	sent := time.Now()
	g, err := l.d.TryAcquire(ctx, req)
	if err != nil {
		var busy *driver.BusyError
		if l.abandoner != nil && !errors.As(err, &busy) && !errors.Is(err, ErrInvalid) {
			l.abandon(ctx, req)
		}
		return nil, sent, err
	}
	sent, err = l.checkValidity(ctx, req, g, sent)
	return g, sent, err
}

func (l *Locker) checkValidity(ctx context.Context, req driver.Request, g *driver.Grant, sent time.Time) (time.Time, error) {
	if g == nil || g.Handle == nil {
		return sent, fmt.Errorf("dlock: driver returned an empty grant for %q", req.Name)
	}
	if !g.Sent.IsZero() {
		sent = g.Sent
	}
	now, until := time.Now(), validUntil(sent, req.TTL, g)
	if now.Before(until) {
		return sent, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), req.TTL)
	defer cancel()
	_ = g.Handle.Release(rctx) // best effort: it expires anyway
	// Not ErrNotAcquired: nobody else holds the lock, the TTL is too short
	// for the time the grant took.
	return sent, fmt.Errorf("%w: %q was granted, but the reply came %v after the request was sent, past the grant's validity of %v (TTL minus drift margin); given back",
		ErrGrantExpired, req.Name, now.Sub(sent).Round(time.Microsecond), until.Sub(sent))
}

// abandon removes, in the background, a lock that a failed attempt may have
// taken (or that a lease declared lost may still hold), bounded by the TTL.
// Close waits for it, as long as its ctx lasts.
func (l *Locker) abandon(ctx context.Context, req driver.Request) {
	l.bg.Add(1)
	l.abandons.Add(1)
	go func() {
		defer l.bg.Done()
		defer l.abandons.Add(-1)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), req.TTL)
		defer cancel()
		_ = l.abandoner.Abandon(actx, req) // best effort: the lock expires anyway
	}()
}

// poll is the waiting loop for drivers without a server-side queue: one
// attempt, then wait for a release notification (when the driver offers
// them) or for the holder's remaining TTL, then again.
func (l *Locker) poll(ctx context.Context, req *driver.Request, o Options) (*driver.Grant, time.Time, error) {
	var notify <-chan struct{}
	retry := backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax}
	var lastErr error
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	req.Wait = newToken()
	if l.waitNotifier != nil {
		defer l.waitNotifier.EndWait(*req)
	}
	// A Notifier's Watch serves locks only (see driver.Notifier).
	canWatch := l.waitNotifier != nil || l.notifier != nil && req.Kind == driver.KindLock
	for first := true; ; first = false {
		if !first {
			req.Token = newToken() // see driver.Abandoner
		}
		g, sent, err := l.attempt(ctx, *req)
		if err == nil {
			return g, sent, nil
		}
		if ctx.Err() != nil {
			return nil, sent, joinLine(ErrNotAcquired, lastErr)
		}
		var delay time.Duration
		var busy *driver.BusyError
		switch {
		case errors.As(err, &busy):
			lastErr = nil
			if canWatch && notify == nil {
				c, stopWatch, queued, werr := l.watch(ctx, *req)
				if werr == nil {
					defer stopWatch()
					notify = c
					if !queued {
						continue // the release may have come before the watch: look again
					}
				} else {
					lastErr = werr
				}
			}
			if notify != nil {
				// Notified waiting; poll only when the holder's lock would
				// expire, or rarely if that is unknown.
				delay = busy.RetryAfter + time.Millisecond
				if busy.RetryAfter <= 0 {
					delay = o.RetryMax
				}
			} else {
				delay = retry.Next()
				if busy.RetryAfter > 0 && busy.RetryAfter < delay {
					delay = busy.RetryAfter + time.Millisecond
				}
			}
		case errors.Is(err, ErrGrantExpired):
			// The grant took longer than the TTL allows: again, after a
			// backoff (at once could spin while the TTL stays too short).
			lastErr = err
			delay = retry.Next()
		case errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed):
			return nil, sent, err
		default: // a backend error: keep trying until ctx ends
			lastErr = err
			delay = retry.Next()
			l.logRetry(ctx, req.Name, err, delay)
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return nil, sent, joinLine(ErrNotAcquired, lastErr)
		case <-notify:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// watch starts the watch of a wait that found the lock busy; queued reports
// that the attempt already queued it (see driver.WaitNotifier). stop ends
// the watch (a WaitNotifier's ends with EndWait instead).
func (l *Locker) watch(ctx context.Context, req driver.Request) (c <-chan struct{}, stop func(), queued bool, err error) {
	if l.waitNotifier != nil {
		c, queued, err = l.waitNotifier.WatchWait(ctx, req)
		return c, func() {}, queued, err
	}
	c, stop, err = l.notifier.Watch(ctx, req.Name)
	return c, stop, false, err
}

func (l *Locker) newLease(req driver.Request, o Options, g *driver.Grant, sent time.Time) (*Lease, error) {
	ls := newLease(l, req, o, g, sent)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), req.TTL)
		defer cancel()
		_ = g.Handle.Release(ctx)
		return nil, ErrClosed
	}
	l.leases[ls] = struct{}{}
	ls.start(sent)
	l.mu.Unlock()
	ls.watchLoss()
	return ls, nil
}

func (l *Locker) forget(ls *Lease) {
	l.mu.Lock()
	delete(l.leases, ls)
	l.mu.Unlock()
}

// Close releases every lease still held through this Locker, ends waits in
// progress (they return ErrClosed), stops all background work and closes the
// driver. A release whose request fails (a timeout, a connection reset) is
// tried again while ctx lasts and the lease is valid, and an error is
// returned for the leases that could not be released (their locks go at
// their TTL).
//
// Close returns by ctx's deadline. When ctx ends first, the leases not yet
// released have ended all the same, and the clean-up still under way (an
// attempt's lock being removed, the driver closing) goes on in the
// background, bounded by its own timeouts; the error says what was left
// and matches ctx.Err(). What is left never removes a lock another lease
// holds: every clean-up names its own token. Later calls return
// ErrClosed; a second Close returns nil.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.cancelClosing(ErrClosed)
	for _, cancel := range l.waits {
		cancel(ErrClosed)
	}
	l.mu.Unlock()

	c := &closing{l: l}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	select {
	case <-done:
		return c.err(nil)
	case <-ctx.Done():
	}
	select {
	case <-done: // finished as ctx ended
		return c.err(nil)
	default:
	}
	return c.err(ctx.Err())
}

// closing is the work of one Close: it runs in a goroutine of its own, so
// that Close can return by its ctx's deadline and leave the rest to finish
// in the background.
type closing struct {
	l *Locker

	mu        sync.Mutex
	stage     closeStage
	releasing map[*Lease]error // leases whose release has not returned: its last try's error
	errs      []error          // releases that failed, the driver's Close
}

type closeStage int

const (
	closeAcquisitions closeStage = iota // waiting for acquisitions to return
	closeReleases                       // releasing the leases
	closeBackground                     // waiting for timed tasks and abandons
	closeDriver                         // closing the driver
	closeDone
)

func (c *closing) setStage(s closeStage) {
	c.mu.Lock()
	c.stage = s
	c.mu.Unlock()
}

// run does Close's work in order: acquisitions return (Close cancelled
// them), leases are released, timed tasks and attempts' clean-ups finish,
// then the driver closes.
func (c *closing) run(ctx context.Context) {
	l := c.l
	l.inflight.Wait()

	l.mu.Lock()
	leases := make([]*Lease, 0, len(l.leases))
	for ls := range l.leases {
		leases = append(leases, ls)
	}
	l.mu.Unlock()
	c.mu.Lock()
	c.stage = closeReleases
	c.releasing = make(map[*Lease]error, len(leases))
	for _, ls := range leases {
		c.releasing[ls] = nil
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, ls := range leases {
		wg.Go(func() {
			err := releaseOnClose(ctx, ls, func(err error) {
				c.mu.Lock()
				if _, ok := c.releasing[ls]; ok {
					c.releasing[ls] = err
				}
				c.mu.Unlock()
			})
			// A release that failed still ends the lease here; the server
			// drops the lock at its TTL.
			ls.end(fmt.Errorf("%w: the locker was closed: %w", ErrLost, ErrClosed))
			c.mu.Lock()
			delete(c.releasing, ls)
			if err != nil && !errors.Is(err, ErrNotHeld) {
				c.errs = append(c.errs, fmt.Errorf("dlock: releasing %q on close: %w", ls.name, err))
			}
			c.mu.Unlock()
		})
	}
	wg.Wait()

	// Every lease has ended, so no timed task starts any more; wait for
	// those still running, and for attempts' clean-ups.
	c.setStage(closeBackground)
	l.sched.close()
	l.bg.Wait()
	c.setStage(closeDriver)
	err := l.d.Close()
	c.mu.Lock()
	c.stage = closeDone
	if err != nil {
		c.errs = append(c.errs, err)
	}
	c.mu.Unlock()
}

// err returns Close's error: the failures so far and, when cut (Close's
// ctx's error, nil when run finished) ended Close before run finished, what
// was left to do. It ends the leases whose release had not returned.
func (c *closing) err(cut error) error {
	c.mu.Lock()
	errs := slices.Clone(c.errs)
	stage := c.stage
	var unreleased []*Lease
	for ls, err := range c.releasing {
		unreleased = append(unreleased, ls)
		if err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, fmt.Errorf("dlock: releasing %q on close: %w", ls.name, err))
		}
	}
	c.mu.Unlock()
	if cut == nil || stage == closeDone {
		return errors.Join(errs...)
	}
	for _, ls := range unreleased {
		ls.end(fmt.Errorf("%w: the locker was closed: %w", ErrLost, ErrClosed))
	}
	var left []string
	if stage == closeAcquisitions {
		left = append(left, "acquisitions under way had not returned")
	}
	if n := len(unreleased); n > 0 {
		left = append(left, fmt.Sprintf("%s abandoned; %s with %s TTL", plural(n, "lease's release", "leases' releases"),
			plural1(n, "its lock expires", "their locks expire"), plural1(n, "its", "their")))
	}
	if stage == closeBackground && c.l.abandons.Load() == 0 {
		left = append(left, "timed tasks still running")
	}
	if stage <= closeBackground {
		if n := c.l.abandons.Load(); n > 0 {
			left = append(left, fmt.Sprintf("%s abandoned; %s with %s TTL", plural(int(n), "attempt's clean-up", "attempts' clean-ups"),
				plural1(int(n), "its lock, if taken, expires", "their locks, if taken, expire"), plural1(int(n), "its", "their")))
		}
	}
	if stage <= closeDriver {
		left = append(left, "closing the driver abandoned; it goes on in the background")
	}
	return errors.Join(append([]error{fmt.Errorf("dlock: Close: %w before the clean-up finished: %s", cut, strings.Join(left, "; "))}, errs...)...)
}

// plural returns "n one" or "n many" as n is 1 or not.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// plural1 returns one or many as n is 1 or not.
func plural1(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// releaseOnClose releases ls for Close, trying again after a failed
// request (a timeout, a connection reset) while ctx lasts and the lease is
// valid: Close is often a process's last chance to give its locks back
// before they stand in others' way until their TTL. The waits between tries
// grow from 5ms to 200ms. failed is told of each try that fails.
func releaseOnClose(ctx context.Context, ls *Lease, failed func(error)) error {
	retry := backoff.Backoff{Min: 5 * time.Millisecond, Max: 200 * time.Millisecond}
	for {
		err := ls.Release(ctx)
		if err != nil {
			failed(err)
		}
		if err == nil || ls.Err() != nil || ctx.Err() != nil {
			return err
		}
		delay := retry.Next()
		if !time.Now().Add(delay).Before(ls.ValidUntil()) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// newToken returns 128 random bits, hex-encoded. The bits come from
// crypto/rand, read 32 tokens' worth at a time; every byte is
// handed out once.
func newToken() string {
	tb := tokenBufs.Get().(*tokenBuf)
	if tb.n == 0 {
		_, _ = crand.Read(tb.b[:]) // never fails (crypto/rand)
		tb.n = len(tb.b)
	}
	var dst [2 * tokenBytes]byte
	hex.Encode(dst[:], tb.b[tb.n-tokenBytes:tb.n])
	clear(tb.b[tb.n-tokenBytes : tb.n])
	tb.n -= tokenBytes
	tokenBufs.Put(tb)
	return string(dst[:])
}

const tokenBytes = 16

// tokenBuf holds random bytes not yet handed out: b[:n].
type tokenBuf struct {
	b [32 * tokenBytes]byte
	n int
}

var tokenBufs = sync.Pool{New: func() any { return new(tokenBuf) }}

// drift is the default clock drift margin: TTL/100 + 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

func validUntil(sent time.Time, requested time.Duration, g *driver.Grant) time.Time {
	ttl := requested
	if g.TTL > 0 {
		ttl = g.TTL
	}
	d := g.Drift
	if d <= 0 {
		d = drift(ttl)
	}
	return sent.Add(ttl - d)
}
