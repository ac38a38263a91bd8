package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/redishub"
)

// settleDelay is how long a waiter that has been handed the lock by fewer
// than a majority of nodes waits for the others before it looks again.
const settleDelay = 10 * time.Millisecond

// fallbackMin is the shortest time a waiter waits without being woken
// before it looks again anyway (its attempt registers its ticket again where
// it is missing): up to twice as long, at random. It bounds the wait of a
// waiter whose hand-off went astray (see releaseWatch). Each time it looks
// again so without having been handed a release since, the time doubles, up
// to fallbackMax, so that waiters behind a lock held for long do not keep
// asking every node.
const (
	fallbackMin = 200 * time.Millisecond
	fallbackMax = 16 * fallbackMin
)

// watchRetryMin and watchRetryMax bound the pause before a waiter watches
// again a node whose watch failed (see driver.watch). Each attempt waits
// for the node's pub/sub connection, which the hub re-dials on its own.
const (
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = 2 * time.Second
)

// queueTTL is how long a waiters' queue outlives its last registration, so
// that tickets that nobody removed (their Locker died) do not stay forever.
const queueTTL = time.Minute

// releaseWatch is one waiter: its ticket in the name's queue on every node
// (registered by its attempts that find the lock busy, see acquire.lua),
// what the nodes hand it, and one signal to look again.
//
// A release hands the lock, on each node, to the first ticket of that
// node's queue whose Locker listens (see release.lua): the node stores the
// wait's hand-off token as the lock's value, with the wait's TTL, and tells
// that Locker's pub/sub connection alone. Tickets are scored by when their
// waiter began to wait (the Locker's clock, the same score on every node),
// so the nodes agree on who is next and waiters are served about in order.
// The waiter records each node's hand-off (handed, fences): once a majority
// handed it the lock it is woken, and its next attempt is granted at once
// from those records (see handedGrant). When fewer do, it is woken
// settleDelay after the first, and its next attempt asks every node,
// counting those it finds handed to it as hand-offs; an attempt after a
// fallback wake-up adopts them instead (see acquire.lua), which ends a
// split of the nodes among waiters. A connection that
// failed or was subscribed again may have missed a hand-off (and the node
// may have dropped the ticket of a Locker it did not hear): that wakes the
// waiter at once, and its attempt registers its ticket there again, or
// finds the lock handed to it.
//
// A hand-off can still go astray (a lost message, a queue lost in a
// restart): a waiter not woken for fallbackMin to twice that looks again
// anyway (less often as its wait goes on without hand-offs).
type releaseWatch struct {
	d      *driver // nil in unit tests: no tickets
	name   string
	keys   []string
	id     string // the wait's hand-off token (the lock's value when handed to it), routes its messages
	ticket string // d.id + ":" + id + ":" + px
	px     int64  // the wait's TTL in ms, which a hand-off grants (0: a waiter that only watches)
	score  int64  // µs since 1970
	quorum int
	c      chan struct{} // 1-buffered: look again

	mu       sync.Mutex
	heard    []bool // nodes that handed over a release since the last signal
	count    int
	timer    *time.Timer
	armed    bool // timer is set to signal
	fallback *time.Timer
	quiet    time.Duration // the fallback's time now: fallbackMin, doubling
	stopped  bool
	deq      []bool     // nodes whose ticket a grant or a hand-off removed
	inflight []int      // requests on their way that may register the ticket, by node
	idle     *sync.Cond // on mu: a node's inflight fell to 0

	// The hand-offs (see handedGrant): each node that handed the lock to
	// this wait, with its fencing counter then. They are trusted while
	// direct holds: until an attempt of the wait may have adopted a handed
	// node (or the wait gave one back), nothing but expiry removes the
	// hand-off token from a node that handed it, and it expires no sooner
	// than since + the TTL.
	since   time.Time // before any request that could register the ticket was sent
	handed  []bool
	fences  []uint64
	nHanded int
	direct  bool
	stale   bool    // the fallback woke the waiter (no hand-off for fallbackMin or more): its next attempt adopts
	granted bool    // a hand-off grant: the lease's token is id
	lease   *handle // the hand-off grant's
}

func newReleaseWatch(nodes, quorum int) *releaseWatch {
	return &releaseWatch{quorum: quorum, c: make(chan struct{}, 1), heard: make([]bool, nodes),
		deq: make([]bool, nodes), inflight: make([]int, nodes),
		handed: make([]bool, nodes), fences: make([]uint64, nodes), direct: true, since: time.Now()}
}

// newToken returns 32 random hex digits: a wait's hand-off token, fresh for
// each watch, so that what was handed to one watch is never taken for
// another's (each counts its validity from its own start).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newID returns 16 random hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// notify is called by node i's hub (with the hub's lock held): message is
// a message on the wait's channel, with its payload ("<id>:<counter>" for a
// hand-off, "<id>" for a wake-up), !message a connection that failed or was
// subscribed again.
func (w *releaseWatch) notify(i int, payload string, message bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.quiet = fallbackMin
	if !message {
		w.fire()
		return
	}
	if _, c, ok := strings.Cut(payload, ":"); ok {
		if f, err := strconv.ParseUint(c, 10, 64); err == nil {
			w.hand(i, f)
		}
	}
	if !w.heard[i] {
		w.heard[i] = true
		w.count++
	}
	if w.count >= w.quorum || w.direct && w.nHanded >= w.quorum {
		w.fire()
		return
	}
	if !w.armed {
		w.arm(settleDelay)
	}
}

// hand records that node i holds the lock for this wait, its counter at f;
// w.mu held.
func (w *releaseWatch) hand(i int, f uint64) {
	if !w.handed[i] {
		w.handed[i] = true
		w.nHanded++
	}
	w.fences[i] = f
	w.deq[i] = true // a hand-off removes the ticket
}

// found records what an attempt's acquire.lua found on node i: the lock
// handed to this wait (not adopted), with the node's counter at f. It is a
// hand-off whose message may be on its way, or lost.
func (w *releaseWatch) found(i int, f uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.hand(i, f)
	if w.direct && w.nHanded >= w.quorum {
		w.fire()
	}
}

// arm sets the timer to signal after d; w.mu held.
func (w *releaseWatch) arm(d time.Duration) {
	w.armed = true
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.settled)
	} else {
		w.timer.Reset(d)
	}
}

func (w *releaseWatch) settled() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.armed && !w.stopped {
		w.fire()
	}
}

// fire signals the waiter and starts counting afresh; w.mu held.
func (w *releaseWatch) fire() {
	clear(w.heard)
	w.count = 0
	if w.armed {
		w.armed = false
		w.timer.Stop()
	}
	w.armFallback()
	redishub.Signal(w.c)
}

// armFallback (re)starts the fallback timer; w.mu held.
func (w *releaseWatch) armFallback() {
	if w.d == nil {
		return
	}
	// Not internal/backoff: a fallback wakes waiters anywhere in [quiet,
	// 2×quiet) so that those of one name spread out, and it doubles only
	// when it fired (fellBack), not on every arming.
	w.quiet = min(max(w.quiet, fallbackMin), fallbackMax)
	d := w.quiet + mrand.N(w.quiet)
	if w.fallback == nil {
		w.fallback = time.AfterFunc(d, w.fellBack)
	} else {
		w.fallback.Reset(d)
	}
}

func (w *releaseWatch) fellBack() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.quiet *= 2
	w.stale = true
	w.fire()
}

// track counts a request of an attempt on node i that may register the
// ticket there; it returns false, and counts nothing, once the watch has
// stopped (the request must then not register it).
func (w *releaseWatch) track(i int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.inflight[i]++
	return true
}

// untrack ends a request counted by track: granted, it removed the ticket
// (see acquire.lua); otherwise it may have registered it.
func (w *releaseWatch) untrack(i int, granted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight[i]--
	w.deq[i] = granted
	if w.inflight[i] == 0 && w.idle != nil {
		w.idle.Broadcast()
	}
}

// stop silences the watch and removes its ticket from the queues that may
// still have it (those from which no grant or hand-off removed it): it
// returns once that is done on enough nodes that, with the nodes a grant or
// a hand-off removed it from, a majority no longer has it, or stopGrace
// later; the removals still running finish in the background, bounded by
// the node timeout.
// Unless the wait was granted by its hand-offs (the lease then holds them),
// every node is also asked to give back what it handed to the wait, and to
// hand it to the next waiter (giveBack): a hand-off whose message is still
// on its way, or that an attempt did not adopt.
func (w *releaseWatch) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.fallback != nil {
		w.fallback.Stop()
	}
	if w.d == nil {
		w.mu.Unlock()
		return
	}
	clean := make([]bool, len(w.deq))
	for i := range clean {
		clean[i] = w.deq[i] && w.inflight[i] == 0
	}
	giveBack, lease := !w.granted && w.px > 0, w.lease
	w.idle = sync.NewCond(&w.mu)
	w.mu.Unlock()
	w.d.unwatch(w, giveBack, lease)
	n := 0
	done := make(chan struct{}, len(clean))
	for i, nd := range w.d.nodes {
		if clean[i] {
			n++
			if !giveBack {
				continue
			}
		}
		w.d.bg.Add(1)
		go func() {
			defer w.d.bg.Done()
			// A registration on its way must not land after the removal.
			w.mu.Lock()
			for w.inflight[i] > 0 {
				w.idle.Wait()
			}
			w.mu.Unlock()
			nctx, cancel := nodeCtx(context.Background(), w.d.watchTimeout(), true)
			defer cancel()
			if giveBack {
				_ = nd.giveBack(nctx, w.keys, w.ticket, w.id)
			} else {
				_ = nd.c.ZRem(nctx, w.keys[1], w.ticket).Err()
			}
			done <- struct{}{}
		}()
	}
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	for ; n < w.quorum; n++ {
		select {
		case <-done:
		case <-t.C:
			return // the nodes do not answer: the rest is left to the background
		}
	}
}

// stopGrace bounds stop's wait for the removals: a wait that ended with its
// ctx returns this soon after, even when the nodes do not answer. A ticket
// left meanwhile costs the next waiter a pass-on of the hand-off (see
// missed), not the lock.
const stopGrace = 200 * time.Millisecond

// tickets returns, for an attempt on name, the scores and tickets of this
// Locker's waiters on it, which acquire.lua registers where the lock is
// busy, and, when there is exactly one, that waiter.
func (d *driver) tickets(name string) ([]any, *releaseWatch) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	ws := d.watching[name]
	if len(ws) == 0 {
		return nil, nil
	}
	regs := make([]any, 0, 2*len(ws))
	var own *releaseWatch
	for w := range ws {
		regs = append(regs, w.score, w.ticket)
		own = w
	}
	if len(ws) > 1 {
		own = nil
	}
	return regs, own
}

// maxGone bounds how many waiters that left a Locker remembers, to pass on
// hand-offs that reach them late (see missed).
const maxGone = 256

// goneWait is a waiter that left: what giveBack needs.
type goneWait struct {
	name, ticket string
	token        string  // the hand-off token to give back; "" for a waiter that only watched
	lease        *handle // granted by its hand-offs: give back only once its release began
}

// unwatch forgets a waiter that left; giveBack: what a node hands it from
// now on is to be given back (see missed). A waiter granted by its
// hand-offs (lease) gives back only what is handed to it once that lease's
// release has begun: before, its lease holds it (and its release deletes
// it).
func (d *driver) unwatch(w *releaseWatch, giveBack bool, lease *handle) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	delete(d.watching[w.name], w)
	if len(d.watching[w.name]) == 0 {
		delete(d.watching, w.name)
	}
	delete(d.live, w.id)
	if len(d.goneIDs) == maxGone {
		delete(d.gone, d.goneIDs[0])
		d.goneIDs = d.goneIDs[1:]
	}
	g := goneWait{name: w.name, ticket: w.ticket}
	if w.px > 0 && (giveBack || lease != nil) {
		g.token, g.lease = w.id, lease
	}
	d.gone[w.id] = g
	d.goneIDs = append(d.goneIDs, w.id)
}

// missed is called by node i's hub for every message this Locker hears on
// a name's channel (with the hub's lock held): one for a wait that has left
// (its ticket was still in the queue) is given back and passed on to the
// next waiter, in the background, so that the lock does not sit held for
// nobody while the others wait; for a wait granted by its hand-offs, once
// its lease has been released (until then the lease holds it, and its
// release deletes it where it is there in time).
func (d *driver) missed(i int, payload string) {
	id, _, _ := strings.Cut(payload, ":")
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.live[id] {
		return
	}
	g, ok := d.gone[id]
	if !ok || d.closing {
		return
	}
	keys := d.keys(g.name)
	nd := d.nodes[i]
	give := func() {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			nctx, cancel := nodeCtx(context.Background(), d.watchTimeout(), true)
			defer cancel()
			_ = nd.giveBack(nctx, keys, g.ticket, g.token)
		}()
	}
	if g.lease != nil {
		d.bg.Add(1)
		go func() { // not under the hub's lock
			defer d.bg.Done()
			g.lease.afterEnd(give)
		}()
		return
	}
	give()
}

// watchTimeout bounds the queue requests of a waiter, which knows no TTL.
func (d *driver) watchTimeout() time.Duration {
	if d.nodeTimeout > 0 {
		return d.nodeTimeout
	}
	return MaxDefaultNodeTimeout
}

// giveBack runs release.lua on the node for a wait that has ended: it
// removes the wait's ticket and, if the lock holds the wait's hand-off
// token (never, for token ""), deletes it and hands it to the next waiter
// as a release does.
func (nd *node) giveBack(nctx context.Context, keys []string, ticket, token string) error {
	return releaseScript.Run(nctx, nd.c, keys, token, "1", ticket).Err()
}
