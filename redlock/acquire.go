// One file, over 600 lines: one acquisition across the nodes — the requests,
// the replies' bookkeeping, the judgement (majority, split vote, too late)
// and the grant handed over by a release — is one state machine.

package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	goredis "github.com/redis/go-redis/v9"
)

// acqReply is one node's answer during an acquisition: to the acquire
// script, or (fenced) to the fencing write-back.
type acqReply struct {
	i       int
	fenced  bool   // the answer to fence.lua
	granted bool   // the node took the lock (acquire) or holds it at the fence (fenced)
	counter uint64 // acquire, granted or handed: the node's fencing counter
	adopted bool   // acquire, granted: the node held the lock for the wait, which this attempt took over
	handed  bool   // acquire: the node holds the lock for the wait (not adopted); busy for this attempt
	pttl    int64  // acquire, busy: the holder's remaining ms, -1 for none
	holder  string // acquire, busy: the holder's token
	err     error
}

// nodeState is where one node stands in an acquisition.
type nodeState uint8

const (
	asking  nodeState = iota // the acquire script is on its way (again)
	taken                    // took the lock; the fencing token is not chosen yet
	fencing                  // took the lock; its counter is being raised to the fencing token
	holding                  // holds the lock at the fencing token: counts toward the majority
	busy                     // another token holds the lock there
	failed                   // no answer, or the lock expired before its fencing token was written
)

// acquisition is one TryAcquire: a goroutine per node runs the node's
// requests, and the caller's goroutine decides from their replies.
type acquisition struct {
	d       *driver
	req     dlockdriver.Request
	keys    []string
	px      int64
	timeout time.Duration
	start   time.Time
	h       *handle
	regs    []any         // this Locker's waiters on the name: their scores and tickets, to register where the lock is busy
	own     *releaseWatch // the attempt's wait, or else the one waiter of this Locker on the name, if there is one
	wait    *releaseWatch // the attempt's wait, when it has a hand-off token
	adopt   bool          // take over nodes handed to the wait (see acquire.lua)
	steal   bool          // take the lock whoever holds it (steal.lua, Steal)

	// first bounds every node's first request, detached from the caller's
	// ctx; the last of them to end cancels it.
	first       context.Context
	cancelFirst context.CancelFunc
	firstLeft   atomic.Int32

	replies chan acqReply
	again   []chan struct{} // 1-buffered: run the acquire script on the node again
	fences  []chan uint64
	decided chan struct{}
	// Written before decided is closed: whether the attempt won, and
	// whether a node giving its lock back announces it (see TryAcquire).
	won, announce bool

	state   []nodeState
	last    []acqReply // each node's last answer
	fence   uint64
	granted []int // nodes taken before the fencing token was chosen
	errs    []error
}

// TryAcquire sends the acquire script to every node at once, each request
// bounded by the node timeout, and decides as soon as a majority can: the
// lock is granted when a majority took it (and, with fencing, holds the
// fencing token, see fence), and refused as soon as a majority no longer
// can, unless the attempt leads a split vote (see lead). Requests still
// running then finish in the background; a node that took the lock for an
// attempt that failed gives it back at once, waking waiters only if others
// may be waiting for this attempt: when its caller abandoned it, or when it
// led a split vote and gave up.
//
// An attempt of a wait that a majority of nodes handed the lock to is
// granted from those hand-offs without a request (see handedGrant).
// Otherwise an attempt of a wait reports the nodes it finds handed to the
// wait (see acquire.lua), unless the wait was handed some nodes and then
// nothing for fallbackMin (a split of the nodes among waiters, or
// hand-offs astray): that attempt adopts them, and so does every later
// attempt of the wait.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	d.prewatch(ctx, req)
	var wait *releaseWatch
	if req.Wait != "" {
		d.wmu.Lock()
		if w := d.waits[req.Wait]; w != nil && w.rw.px > 0 {
			wait = w.rw
		}
		d.wmu.Unlock()
	}
	adopt := false
	if wait != nil {
		if g, ok, err := d.handedGrant(ctx, req, wait); ok {
			return g, err
		}
		wait.mu.Lock()
		if !wait.direct || wait.nHanded > 0 && wait.stale {
			// Its records are no longer to be trusted once this attempt
			// may have taken a handed node over (and may give it back).
			wait.direct = false
			adopt = true
		}
		wait.mu.Unlock()
	}
	a := d.newAcquisition(req)
	a.regs, a.own = d.tickets(req.Name)
	if wait != nil {
		a.own, a.wait, a.adopt = wait, wait, adopt
	}
	return a.run(ctx)
}

// Steal takes req.Name over on every node at once with steal.lua
// (dlockdriver.Stealer): each node that answers grants, and the steal is
// decided as an acquisition is, on a majority at one fencing token. A
// steal that fails (no majority answered in time) gives back the nodes it
// took, which then no longer hold the previous holder's lock either: that
// holder's next refresh may find too few. Waiters keep their places in
// every node's queue.
func (d *driver) Steal(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	a := d.newAcquisition(req)
	a.steal = true
	return a.run(ctx)
}

// newAcquisition returns the acquisition of req, not started.
func (d *driver) newAcquisition(req dlockdriver.Request) *acquisition {
	n := len(d.nodes)
	a := &acquisition{
		d: d, req: req, keys: d.keys(req.Name), px: millis(req.TTL), timeout: d.timeout(req.TTL),
		start:   time.Now(),
		replies: make(chan acqReply, 2*n),
		again:   make([]chan struct{}, n),
		fences:  make([]chan uint64, n),
		decided: make(chan struct{}),
		state:   make([]nodeState, n),
		last:    make([]acqReply, n),
	}
	a.h = &handle{d: d, keys: a.keys, token: req.Token, ttl: req.TTL,
		acquired: make([]chan struct{}, n), released: make([]bool, n), unsure: make([]bool, n)}
	a.announce = true
	for i := range n {
		a.h.acquired[i] = make(chan struct{})
		a.again[i] = make(chan struct{}, 1)
		a.fences[i] = make(chan uint64, 1)
	}
	return a
}

// run sends the acquisition's first requests to every node and decides.
func (a *acquisition) run(ctx context.Context) (*dlockdriver.Grant, error) {
	n := len(a.d.nodes)
	a.first, a.cancelFirst = nodeCtx(ctx, a.timeout, true)
	a.firstLeft.Store(int32(n))
	for i := range n {
		a.ask(ctx, i)
	}
	defer close(a.decided)
	return a.decide(ctx)
}

// ask runs node i's part of the acquisition: the acquire script, again
// each time the decision asks for it while the node is held by another;
// once the node took the lock, the fencing write-back if asked for; and,
// unless the attempt won, the release of the lock it took.
func (a *acquisition) ask(ctx context.Context, i int) {
	d, nd := a.d, a.d.nodes[i]
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer close(a.h.acquired[i])
		var adopted bool
		first := true
		for {
			own, regs := "", a.regs
			if a.own != nil {
				if a.own.track(i) {
					own = a.own.ticket
				} else {
					regs = nil // it left: do not queue it again
				}
			}
			waitToken := ""
			if a.wait != nil {
				waitToken = a.wait.id
			}
			var r acqReply
			if a.steal {
				r = nd.steal(a.first, a.keys, a.req.Token, a.px)
				first = false
				if a.firstLeft.Add(-1) == 0 {
					a.cancelFirst()
				}
			} else if first {
				// Every node's first request shares one bound: they all
				// leave now (a timer per request costs more than the rest
				// of the client's work).
				r = nd.acquireIn(a.first, a.keys, a.req.Token, a.px, own, regs, waitToken, a.adopt)
				first = false
				if a.firstLeft.Add(-1) == 0 {
					a.cancelFirst()
				}
			} else {
				r = nd.acquire(ctx, a.timeout, a.keys, a.req.Token, a.px, own, regs, waitToken, a.adopt)
			}
			if own != "" {
				a.own.untrack(i, r.granted)
			}
			if r.handed {
				a.wait.found(i, r.counter)
			}
			r.i = i
			adopted = r.adopted
			a.replies <- r
			if r.granted {
				break
			}
			select {
			case <-a.again[i]:
				continue
			case <-a.decided:
				return
			}
		}
		select {
		case f := <-a.fences[i]:
			ok, err := nd.fence(ctx, a.timeout, a.keys, a.req.Token, f)
			a.replies <- acqReply{i: i, fenced: true, granted: ok, err: err}
			<-a.decided
		case <-a.decided:
		}
		if !a.won {
			// A node taken over from the wait is handed on to the next
			// waiter, as the release it came from would have.
			_, _ = nd.release(ctx, a.timeout, true, a.keys, a.req.Token, a.announce || adopted)
		}
	}()
}

// count counts the nodes in any of the states.
func (a *acquisition) count(states ...nodeState) int {
	c := 0
	for _, s := range a.state {
		if slices.Contains(states, s) {
			c++
		}
	}
	return c
}

// record takes in one node's reply.
func (a *acquisition) record(r acqReply) {
	i, q := r.i, a.d.quorum
	a.last[i] = r
	switch {
	case r.err != nil:
		a.state[i] = failed
		a.errs = append(a.errs, r.err)
	case r.fenced && r.granted:
		a.state[i] = holding
	case r.fenced:
		a.state[i] = failed
		a.errs = append(a.errs, fmt.Errorf("%s: the lock expired before its fencing token was written", a.d.nodes[i].name))
	case !r.granted:
		a.state[i] = busy
	case a.d.compat:
		a.state[i] = holding
	case a.fence != 0:
		a.raise(i, r.counter)
	default:
		a.state[i] = taken
		a.granted = append(a.granted, i)
		if len(a.granted) < q {
			break
		}
		// A majority took the lock: the fencing token is the highest of
		// their counters, and the nodes behind it are raised to it.
		for _, j := range a.granted {
			a.fence = max(a.fence, a.last[j].counter)
		}
		for _, j := range a.granted {
			a.raise(j, a.last[j].counter)
		}
	}
}

// raise counts node i, whose counter is c, as holding once its counter is
// at the fencing token, and asks for the write-back when it is behind.
func (a *acquisition) raise(i int, c uint64) {
	if c >= a.fence {
		a.state[i] = holding
		return
	}
	a.state[i] = fencing
	a.fences[i] <- a.fence
}

// outcome is what an acquisition that can no longer win by its first
// replies does.
type outcome uint8

const (
	undecided outcome = iota // wait for more replies
	lead                     // keep the nodes taken and ask the others again
	held                     // another token holds a majority
	yield                    // another contender leads the split vote
	noQuorum                 // too few nodes answered
)

// judge decides what an attempt that cannot win with the nodes it has and
// those still to answer does. A split vote (no token on a majority) is led
// by the contender that took the most nodes, the lowest token among those
// that took as many: every contender that heard from every node sees the
// same nodes held by the same tokens, so all agree on the leader, which
// keeps its nodes and asks the others again while the rest give theirs back
// (see lead). An attempt that took no node does not lead; nor does one
// that cannot tell yet whether nodes still to answer make another the
// leader.
func (a *acquisition) judge() outcome {
	n, q := len(a.d.nodes), a.d.quorum
	holders := a.holders()
	for _, c := range holders {
		if c >= q {
			return held
		}
	}
	nBusy, unknown := a.count(busy), a.count(asking)
	need := n - q + 1 // busy nodes that make the lock busy rather than unreachable
	if nBusy < need && nBusy+unknown >= need {
		return undecided // those still to answer may yet say busy
	}
	mine := a.count(taken, fencing, holding)
	switch {
	case n-a.count(failed) < q:
		return noQuorum
	case mine == 0 && nBusy >= need:
		return yield
	case mine == 0:
		return noQuorum
	}
	beats := func(c int, token string) bool { return c > mine || c == mine && token < a.req.Token }
	for h, c := range holders {
		if beats(c, h) {
			return yield
		}
	}
	if unknown == 0 {
		return lead
	}
	for h, c := range holders {
		if beats(c+unknown, h) {
			return undecided
		}
	}
	if unknown >= mine {
		return undecided // an unseen contender could take them all
	}
	return lead
}

// holders counts the nodes held by each other token, by their last answers.
func (a *acquisition) holders() map[string]int {
	m := map[string]int{}
	for i, s := range a.state {
		if s == busy {
			m[a.last[i].holder]++
		}
	}
	return m
}

// decide reads the nodes' replies until the attempt is granted or refused.
//
// An attempt that leads a split vote (see judge) keeps the nodes it took
// and asks the nodes held by others again, once the other contenders have
// had the time to give them back (half an attempt's time, then doubling),
// until it holds a majority, another token does, or its time to lead is
// over: four times the first round's time, and no more than half the
// validity. The lease's validity still counts from before the first
// request: every node took the lock after that, for the full TTL. A leader
// that gives up announces the release of its nodes, since the others wait
// for it.
func (a *acquisition) decide(ctx context.Context) (*dlockdriver.Grant, error) {
	q := a.d.quorum
	drift := a.d.driftFor(a.req.TTL)
	var (
		leading  bool
		deadline time.Time
		backoff  time.Duration
		timer    *time.Timer
		retry    <-chan time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for a.count(holding) < q {
		if a.count(asking, taken, fencing, holding) < q {
			if !leading {
				switch out := a.judge(); out {
				case undecided:
				case lead:
					leading = true
					e := time.Since(a.start)
					deadline = time.Now().Add(4 * e)
					if limit := a.start.Add((a.req.TTL - drift) / 2); deadline.After(limit) {
						deadline = limit
					}
					// Not internal/backoff: the leader's retries wait for
					// the other contenders to give nodes back, so they
					// scale with the first round's time (e/2, doubling)
					// and end at its deadline, not at fixed bounds.
					backoff = e / 2
				default:
					a.announce = false // a retreat from a lost vote wakes nobody
					return nil, a.refused(out)
				}
			}
			if leading {
				switch {
				case a.majorityHolder():
					a.announce = false // another won: nobody waits for this attempt
					return nil, a.refused(held)
				case len(a.d.nodes)-a.count(failed) < q:
					return nil, a.refused(noQuorum)
				case retry == nil && a.count(asking) == 0:
					wait := time.Until(deadline)
					if wait <= 0 {
						return nil, a.refused(lead) // gave up
					}
					if timer == nil {
						timer = time.NewTimer(min(backoff, wait))
					} else {
						timer.Reset(min(backoff, wait))
					}
					retry = timer.C
					backoff *= 2
				}
			}
		}
		select {
		case r := <-a.replies:
			a.record(r)
		case <-retry:
			retry = nil
			for i, s := range a.state {
				if s == busy {
					a.state[i] = asking
					a.again[i] <- struct{}{}
				}
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("redlock: acquiring %q: %w", a.keys[0], ctx.Err())
		}
	}
	if elapsed := time.Since(a.start); elapsed >= a.req.TTL-drift {
		// Granted, too late to be of use: nobody else holds the lock, so
		// not ErrNotAcquired (which would end a TryAcquire as "held" and
		// an Acquire's retries as a backend error). The nodes are given
		// back by ask, since the attempt did not win.
		return nil, fmt.Errorf("%w: redlock: a majority for %q took %v, past the TTL %v minus drift %v",
			dlock.ErrGrantExpired, a.keys[0], elapsed.Round(time.Microsecond), a.req.TTL, drift)
	}
	a.won = true
	a.h.fence = a.fence
	a.d.hold(a.req.Token, a.h)
	return &dlockdriver.Grant{
		Handle: a.h,
		Fence:  a.fence,
		TTL:    time.Duration(a.px) * time.Millisecond,
		Drift:  a.d.drift,
	}, nil
}

// majorityHolder reports whether another token holds a majority.
func (a *acquisition) majorityHolder() bool {
	for _, c := range a.holders() {
		if c >= a.d.quorum {
			return true
		}
	}
	return false
}

// refused builds the error of an attempt that cannot be granted: a
// *dlockdriver.BusyError when enough nodes are held by others, else an
// ErrNoQuorum error carrying the nodes' errors.
func (a *acquisition) refused(why outcome) error {
	n, q := len(a.d.nodes), a.d.quorum
	nBusy := a.count(busy)
	if why == noQuorum || nBusy < n-q+1 {
		return fmt.Errorf("%w: acquiring %q: %d of %d nodes failed and %d are held by others: %w",
			ErrNoQuorum, a.keys[0], a.count(failed), n, nBusy, errors.Join(a.errs...))
	}
	// A holder seen on a majority keeps the lock until the majority-th
	// longest of its remaining times has passed (unless it refreshes or
	// releases, which wakes waiters).
	byHolder := map[string][]int64{}
	for i, s := range a.state {
		if s == busy {
			byHolder[a.last[i].holder] = append(byHolder[a.last[i].holder], a.last[i].pttl)
		}
	}
	for _, pttls := range byHolder {
		if len(pttls) < q {
			continue
		}
		slices.Sort(pttls)
		slices.Reverse(pttls)
		if pttls[q-1] < 0 {
			return dlockdriver.Busy(0) // keys without expiry: unknown
		}
		return dlockdriver.Busy(time.Duration(pttls[q-1])*time.Millisecond + time.Millisecond)
	}
	e := time.Since(a.start)
	if why == yield {
		// Another contender leads the split vote: it should hold the lock
		// within a few attempts' time, and its release, or its giving up,
		// wakes the waiters. Look again later in case neither comes (the
		// contenders did not see the same votes).
		return dlockdriver.Busy(8*e + rand.N(8*e+time.Millisecond))
	}
	// No holder in sight on a majority and no leader: retry after a random
	// delay of the order of an attempt, so that contenders do not meet
	// again.
	return dlockdriver.Busy(e + rand.N(2*e+time.Millisecond))
}

// acquire runs acquire.lua on the node. The request is detached from ctx:
// its outcome matters even when the caller has left, since a lock it took
// must be given back.
func (nd *node) acquire(ctx context.Context, timeout time.Duration, keys []string, token string, px int64, own string, regs []any, waitToken string, adopt bool) acqReply {
	nctx, cancel := nodeCtx(ctx, timeout, true)
	defer cancel()
	return nd.acquireIn(nctx, keys, token, px, own, regs, waitToken, adopt)
}

// acquireIn is acquire bounded by nctx, a detached context made by nodeCtx.
func (nd *node) acquireIn(nctx context.Context, keys []string, token string, px int64, own string, regs []any, waitToken string, adopt bool) acqReply {
	var cmd *goredis.Cmd
	if own == "" && len(regs) == 0 && waitToken == "" && !adopt {
		// An uncontended TryAcquire: the script takes the rest as empty.
		cmd = acquireScript.Run(nctx, nd.c, keys, token, px)
	} else {
		adoptArg := "0"
		if adopt {
			adoptArg = "1"
		}
		args := append([]any{token, px, own, queueTTL.Milliseconds(), waitToken, adoptArg}, regs...)
		cmd = acquireScript.Run(nctx, nd.c, keys, args...)
	}
	res, err := cmd.Result()
	if err != nil {
		return acqReply{err: fmt.Errorf("%s: %w", nd.name, err)}
	}
	if f, ok := res.(int64); ok && f > 0 { // taken by this call, fence f
		return acqReply{granted: true, counter: uint64(f)}
	}
	v, _ := res.([]any)
	if len(v) < 2 {
		return acqReply{err: fmt.Errorf("%s: unexpected reply %v from acquire.lua", nd.name, res)}
	}
	code, _ := v[0].(int64)
	second, _ := v[1].(int64)
	switch code {
	case 1:
		return acqReply{granted: true, counter: uint64(max(second, 0)), adopted: len(v) > 2}
	case 2:
		return acqReply{handed: true, counter: uint64(max(second, 0)), pttl: px, holder: waitToken}
	}
	r := acqReply{pttl: second}
	if len(v) > 2 {
		r.holder, _ = v[2].(string)
	}
	return r
}

// steal runs steal.lua on the node, bounded by nctx, a detached context
// made by nodeCtx.
func (nd *node) steal(nctx context.Context, keys []string, token string, px int64) acqReply {
	res, err := stealScript.Run(nctx, nd.c, keys, token, px).Result()
	if err != nil {
		return acqReply{err: fmt.Errorf("%s: %w", nd.name, err)}
	}
	if f, ok := res.(int64); ok && f > 0 {
		return acqReply{granted: true, counter: uint64(f)}
	}
	return acqReply{granted: true} // compat: {1, 0}
}

// fence runs fence.lua on the node, detached from ctx as acquire is.
func (nd *node) fence(ctx context.Context, timeout time.Duration, keys []string, token string, f uint64) (bool, error) {
	nctx, cancel := nodeCtx(ctx, timeout, true)
	defer cancel()
	r, err := fenceScript.Run(nctx, nd.c, []string{keys[0], keys[2]}, token, strconv.FormatUint(f, 10)).Int64()
	if err != nil {
		return false, fmt.Errorf("%s: %w", nd.name, err)
	}
	return r == 1, nil
}

// handedGrant grants an attempt of the wait rw from the hand-offs it was
// told of, without a request, when a majority of nodes handed it the lock
// and its records are trusted (see releaseWatch.direct): ok reports that
// it decided (granted, or failed with err). The lease's token is the wait's
// hand-off token, which those nodes hold; its fencing token is the highest
// of their counters, written back (fence.lua) first to those behind it, as
// an acquisition does. Each of those nodes set the lock, with the wait's
// TTL, after the ticket that carried the hand-off was registered there,
// that is after rw.since: the lease's validity counts from rw.since, unless
// that leaves less than two thirds of the TTL, in which case the lock is
// refreshed on every node first (a majority must still hold it) and the
// validity counts from the refresh.
func (d *driver) handedGrant(ctx context.Context, req dlockdriver.Request, rw *releaseWatch) (g *dlockdriver.Grant, ok bool, err error) {
	n, q := len(d.nodes), d.quorum
	rw.mu.Lock()
	if !rw.direct || rw.nHanded < q || rw.px != millis(req.TTL) {
		rw.mu.Unlock()
		return nil, false, nil
	}
	handed, fences, since := slices.Clone(rw.handed), slices.Clone(rw.fences), rw.since
	rw.mu.Unlock()
	fail := func(err error) (*dlockdriver.Grant, bool, error) {
		rw.mu.Lock()
		rw.direct = false // the next attempt asks the nodes, adopting what they handed
		rw.mu.Unlock()
		return nil, true, err
	}
	h := &handle{d: d, keys: d.keys(req.Name), token: rw.id, ttl: req.TTL,
		acquired: make([]chan struct{}, n), released: make([]bool, n), unsure: make([]bool, n)}
	for i := range n {
		h.acquired[i] = make(chan struct{})
		close(h.acquired[i])
	}
	var fence uint64
	for i, ok := range handed {
		if ok {
			fence = max(fence, fences[i])
		}
	}
	holding := 0
	var behind []int
	for i, ok := range handed {
		switch {
		case !ok:
		case fences[i] >= fence:
			holding++
		default:
			behind = append(behind, i)
		}
	}
	if len(behind) > 0 {
		timeout := d.timeout(req.TTL)
		results := make(chan bool, len(behind))
		for _, i := range behind {
			d.bg.Add(1)
			go func() {
				defer d.bg.Done()
				ok, err := d.nodes[i].fence(ctx, timeout, h.keys, h.token, fence)
				results <- ok && err == nil
			}()
		}
		for range behind {
			if <-results { // bounded by the node timeout
				holding++
			}
		}
		if holding < q {
			return fail(fmt.Errorf("%w: acquiring %q: %d of %d nodes handed it over at fencing token %d", ErrNoQuorum, h.keys[0], holding, n, fence))
		}
	}
	sent := since
	if time.Since(since) > req.TTL/3 {
		sent = time.Now()
		if _, err := h.Refresh(ctx, req.TTL); err != nil {
			return fail(err)
		}
	}
	h.fence = fence
	rw.mu.Lock()
	rw.granted, rw.lease = true, h
	rw.mu.Unlock()
	d.hold(req.Token, h)
	return &dlockdriver.Grant{
		Handle: h,
		Fence:  fence,
		TTL:    time.Duration(rw.px) * time.Millisecond,
		Drift:  d.drift,
		Sent:   sent,
	}, true, nil
}
