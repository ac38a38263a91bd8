package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
)

// MaxAcquireAll is the most names one AcquireAll or TryAcquireAll takes.
const MaxAcquireAll = 256

// AcquireAll waits until one lease holds every named lock, or ctx ends: all
// or nothing. The lease is refreshed as a whole, released as a whole (its
// Release frees every name) and lost as a whole: when any one name is lost,
// the lease ends with an error matching ErrLost that names it, and the other
// names are given back. Lease.Names lists the names and Lease.Fences their
// fencing tokens, each increasing as a single lock's would.
//
// The names are taken one by one in sorted order, each waiting as Acquire
// does (notified where the backend notifies), with the names already taken
// kept alive by the watchdog meanwhile. Every AcquireAll takes names in the
// same order, so two of them never deadlock on each other, whatever names
// they share. When ctx ends, or a name taken earlier is lost during the
// wait, the names taken so far are released before it returns (a
// release that fails leaves the name to expire at its TTL); after a loss
// it starts again while ctx lasts.
//
// Options apply to the whole lease: MaxHold and HeartbeatTimeout count from
// the grant of the last name, and NoRefresh leaves the whole lease
// unrefreshed once granted. One name is an Acquire. Names must be valid
// (ValidateName), distinct, and at most MaxAcquireAll.
func (l *Locker) AcquireAll(ctx context.Context, names []string, opts *Options) (*Lease, error) {
	return l.acquireAll(ctx, names, opts, true)
}

// TryAcquireAll makes one attempt at each name in sorted order, stopping at
// the first one held by someone else; then it releases the names it took
// and returns that name's error, matching ErrNotAcquired. See AcquireAll.
func (l *Locker) TryAcquireAll(ctx context.Context, names []string, opts *Options) (*Lease, error) {
	return l.acquireAll(ctx, names, opts, false)
}

func (l *Locker) acquireAll(ctx context.Context, names []string, opts *Options, wait bool) (*Lease, error) {
	if ctx == nil {
		return nil, invalid("nil context")
	}
	sorted, err := validateNames(names)
	if err != nil {
		return nil, err
	}
	if len(sorted) == 1 {
		return l.acquire(ctx, object{name: sorted[0]}, opts, wait)
	}
	o, err := opts.resolve(l.defaults, l.caps)
	if err != nil {
		return nil, err
	}
	return l.observed(ctx, strings.Join(sorted, ","), func() (*Lease, error) {
		return l.acquireAllValid(ctx, sorted, o, wait)
	})
}

// validateNames checks AcquireAll's names and returns them sorted.
func validateNames(names []string) ([]string, error) {
	switch {
	case len(names) == 0:
		return nil, invalid("no lock names to acquire")
	case len(names) > MaxAcquireAll:
		return nil, invalid("%d lock names, over the limit of %d (MaxAcquireAll)", len(names), MaxAcquireAll)
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i, name := range sorted {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
		if i > 0 && sorted[i-1] == name {
			return nil, invalid("lock name %q given twice", name)
		}
	}
	return sorted, nil
}

// acquireAllValid is acquireAll once the input is valid. It counts as one
// acquisition under way for Close, which therefore finds either no lease or
// the whole one.
func (l *Locker) acquireAllValid(ctx context.Context, names []string, o Options, wait bool) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, joinLine(ErrNotAcquired, err)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.inflight.Add(1)
	l.mu.Unlock()
	defer l.inflight.Done()

	// The parts are kept alive by their own watchdogs until the last one
	// is granted; the work's bounds and NoRefresh apply to the whole.
	po := o
	po.NoRefresh, po.MaxHold, po.HeartbeatTimeout = false, 0, 0
	retry := backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax}
	if ma, ok := l.d.(driver.MultiAcquirer); ok && o.Metadata == "" {
		parts, err := l.tryAll(ctx, ma, names, po)
		switch {
		case err == nil:
			ls, err := l.compose(parts, o)
			if err == nil {
				return ls, nil
			}
			l.giveBack(ctx, parts)
			if !wait || !errors.Is(err, ErrLost) {
				return nil, err
			}
		case errors.Is(err, errors.ErrUnsupported):
		case !wait || errors.Is(err, ErrInvalid) || errors.Is(err, ErrClosed):
			return nil, err
		}
		// Busy (or a backend error): wait name by name, in order.
	}
	for {
		parts := make([]*Lease, 0, len(names))
		var err error
		for _, name := range names {
			var p *Lease
			if p, err = l.acquireValid(ctx, object{name: name}, po, wait); err != nil {
				break
			}
			parts = append(parts, p)
		}
		if err == nil {
			var ls *Lease
			if ls, err = l.compose(parts, o); err == nil {
				return ls, nil
			}
		}
		l.giveBack(ctx, parts)
		if !wait || !errors.Is(err, ErrLost) {
			return nil, err
		}
		// A part was lost while a later one was awaited: start again.
		if !retry.Sleep(ctx) {
			return nil, joinLine(ErrNotAcquired, ctx.Err(), err)
		}
	}
}

// tryAll is one attempt at every name in one request (driver.MultiAcquirer):
// the parts, one lease per name, when all were free.
func (l *Locker) tryAll(ctx context.Context, ma driver.MultiAcquirer, names []string, po Options) ([]*Lease, error) {
	reqs := make([]driver.Request, len(names))
	for i, name := range names {
		reqs[i] = driver.Request{Name: name, Token: newToken(), TTL: po.TTL}
	}
	sent := time.Now()
	gs, err := ma.TryAcquireAll(ctx, reqs)
	if err == nil && len(gs) != len(reqs) {
		err = fmt.Errorf("dlock: driver granted %d of %d names in one request", len(gs), len(reqs))
	}
	if err != nil {
		var busy *driver.BusyError
		if l.abandoner != nil && !errors.As(err, &busy) && !errors.Is(err, ErrInvalid) && !errors.Is(err, errors.ErrUnsupported) {
			for _, req := range reqs {
				l.abandon(ctx, req)
			}
		}
		return nil, err
	}
	parts := make([]*Lease, 0, len(gs))
	for i, g := range gs {
		psent, err := l.checkValidity(ctx, reqs[i], g, sent)
		var p *Lease
		if err == nil {
			p, err = l.newLease(reqs[i], po, g, psent)
		}
		if err != nil {
			l.giveBack(ctx, parts)
			for _, g := range gs[i+1:] {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), po.TTL)
				_ = g.Handle.Release(rctx)
				cancel()
			}
			return nil, err
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// giveBack releases parts of an AcquireAll that did not complete, each
// bounded by its TTL; a part that cannot be released expires.
func (l *Locker) giveBack(ctx context.Context, parts []*Lease) {
	eachPart(parts, func(p *Lease) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.TTL())
		defer cancel()
		return p.Release(rctx)
	})
}

// compose makes the lease of an AcquireAll from its parts, one granted lease
// per name. The parts' watchdogs stop: the whole lease's refreshes them
// together, and a part that ends other than by the whole's Release ends the
// whole (Lease.end). The whole's ValidUntil is the earliest of the parts'.
func (l *Locker) compose(parts []*Lease, o Options) (*Lease, error) {
	for _, p := range parts {
		p.stopWatchdog()
	}
	names := make([]string, len(parts))
	ls := &Lease{
		l: l, parts: parts, token: parts[0].token, opts: o,
		ops: make(chan struct{}, 1), retry: backoff.Backoff{Min: o.RetryMin, Max: o.RetryMax},
	}
	for i, p := range parts {
		names[i] = p.name
		p.mu.Lock()
		err, until, ttl := p.err, p.validUntil, p.ttl
		p.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("%w: %q, taken first, ended while the others were awaited: %w", ErrLost, p.name, err)
		}
		if i == 0 || until.Before(ls.validUntil) {
			ls.validUntil = until
		}
		if i == 0 || ttl < ls.ttl {
			ls.ttl = ttl
		}
		d := p.drift
		if d == 0 {
			d = drift(ttl)
		}
		ls.drift = max(ls.drift, d)
		ls.since = p.since // the last part's grant is the whole's
	}
	ls.name = strings.Join(names, ",")
	mh := &multiHandle{parts: parts}
	mh.batch, _ = l.d.(driver.BatchRefresher)
	ls.h = mh
	if o.HeartbeatTimeout > 0 {
		ls.Heartbeat()
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	for _, p := range parts {
		delete(l.leases, p)
		p.mu.Lock()
		p.parent = ls
		err := p.err
		p.mu.Unlock()
		if err != nil { // lost since the check above, before it had a parent
			l.mu.Unlock()
			return nil, fmt.Errorf("%w: %q, taken first, ended while the others were awaited: %w", ErrLost, p.name, err)
		}
	}
	l.leases[ls] = struct{}{}
	// The watchdog's first tick is an interval after the earliest part's
	// last refresh, which the earliest ValidUntil dates.
	ls.start(ls.validUntil.Add(ls.drift - ls.ttl))
	l.mu.Unlock()
	return ls, nil
}

// stopWatchdog stops the lease's watchdog for good, after a refresh in
// flight has returned; the lease stays valid until ValidUntil.
func (ls *Lease) stopWatchdog() {
	ls.ops <- struct{}{}
	ls.mu.Lock()
	ls.refreshStopped = true
	if ls.tick.run != nil {
		ls.l.sched.cancel(&ls.tick)
	}
	ls.mu.Unlock()
	<-ls.ops
}

// multiHandle is the driver.Handle of an AcquireAll's lease: each operation
// on every part at once, each part's under its own ops, as a lease's
// operations are: a part being given back (Lease.endParts) while the
// whole's refresh is still on its way must wait for it, since a driver
// need not take two requests of one handle at once (postgres runs them on
// the lease's one connection: busy run 15 found the race).
type multiHandle struct {
	parts []*Lease
	batch driver.BatchRefresher // the driver's, when it refreshes many in one request
}

// Refresh refreshes every part, in one request when the driver batches, and
// returns the shortest TTL granted. A part that is no longer held ends (and
// with it the whole lease); the error names it.
func (m *multiHandle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	for i, p := range m.parts {
		if err := p.lockOps(ctx); err != nil {
			for _, q := range m.parts[:i] {
				q.unlockOps()
			}
			return 0, err
		}
	}
	defer func() {
		for _, p := range m.parts {
			p.unlockOps()
		}
	}()
	sent := time.Now()
	var errs []error
	if m.batch != nil {
		hs := make([]driver.Handle, len(m.parts))
		ttls := make([]time.Duration, len(m.parts))
		for i, p := range m.parts {
			hs[i], ttls[i] = p.h, ttl
		}
		granted, berrs := m.batch.RefreshBatch(ctx, hs, ttls)
		errs = make([]error, len(m.parts))
		for i, p := range m.parts {
			var g time.Duration
			var err error
			if i < len(granted) {
				g = granted[i]
			}
			if i < len(berrs) {
				err = berrs[i]
			}
			errs[i] = p.applyRefresh(sent, ttl, g, err)
		}
	} else {
		errs = eachPart(m.parts, func(p *Lease) error { return p.refresh(ctx, ttl) })
	}
	if err := partsError(m.parts, errs); err != nil {
		return 0, err
	}
	granted := ttl
	for _, p := range m.parts {
		granted = min(granted, p.TTL())
	}
	return granted, nil
}

// Release releases every part. A part released by an earlier try that
// failed part-way is not sent again.
func (m *multiHandle) Release(ctx context.Context) error {
	return partsError(m.parts, eachPart(m.parts, func(p *Lease) error { return p.Release(ctx) }))
}

// Held asks about every part; a part no longer held ends the whole lease.
func (m *multiHandle) Held(ctx context.Context) (bool, error) {
	held := true
	var mu sync.Mutex
	errs := eachPart(m.parts, func(p *Lease) error {
		ok, err := p.Held(ctx)
		if err == nil && !ok {
			mu.Lock()
			held = false
			mu.Unlock()
		}
		return err
	})
	if err := partsError(m.parts, errs); err != nil {
		return false, err
	}
	return held, nil
}

// eachPart runs f on every part at once and returns their errors.
func eachPart(parts []*Lease, f func(*Lease) error) []error {
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(p)
		}()
	}
	wg.Wait()
	return errs
}

// partsError is the error of an operation on every part: the loss of a part
// first (it decides the whole lease's fate), each naming its part.
func partsError(parts []*Lease, errs []error) error {
	var lost, other []error
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, ErrNotHeld):
			lost = append(lost, fmt.Errorf("%q: %w", parts[i].name, err))
		default:
			other = append(other, fmt.Errorf("%q: %w", parts[i].name, err))
		}
	}
	if len(lost) > 0 {
		return joinLine(append(lost, other...)...)
	}
	return joinLine(other...)
}

// Names lists the lease's lock names: the one name of a lease from Acquire
// or TryAcquire, the sorted names of one from AcquireAll.
func (ls *Lease) Names() []string {
	if ls.parts == nil {
		return []string{ls.name}
	}
	names := make([]string, len(ls.parts))
	for i, p := range ls.parts {
		names[i] = p.name
	}
	return names
}

// Fences returns the fencing token of each name, in the order of Names, and
// true when the backend makes them (see Fence). A lease from AcquireAll
// has no single token: its Fence reports false, and Fences has one per
// name.
func (ls *Lease) Fences() ([]uint64, bool) {
	if ls.parts == nil {
		if !ls.hasFence {
			return nil, false
		}
		return []uint64{ls.fence}, true
	}
	if !ls.parts[0].hasFence {
		return nil, false
	}
	fences := make([]uint64, len(ls.parts))
	for i, p := range ls.parts {
		fences[i] = p.fence
	}
	return fences, true
}

// endParts is what the end of an AcquireAll's lease does to its parts: a
// release has released them all; any other end gives back, in the
// background, those still held.
func (ls *Lease) endParts(err error) {
	if errors.Is(err, ErrReleased) {
		return
	}
	ls.l.bg.Add(1)
	go func() {
		defer ls.l.bg.Done()
		ls.l.giveBack(context.Background(), ls.parts)
	}()
}
