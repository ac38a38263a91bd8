package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/redishub"
)

// settleDelay is how long a waiter that has been handed a release by fewer
// than a majority of nodes waits for the others before it looks again.
const settleDelay = 10 * time.Millisecond

// reserveFor is how long a release reserves the lock for the waiter it hands
// it to (see release.lua): long enough for a woken waiter to send its
// attempt, short enough that a waiter that does not come stalls no one for
// long.
const reserveFor = 50 * time.Millisecond

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

// queueTTL is how long a waiters' queue outlives its last registration, so
// that tickets that nobody removed (their Locker died) do not stay forever.
const queueTTL = time.Minute

// releaseWatch is one waiter: its ticket in the name's queue on every node
// (registered by its attempts that find the lock busy, see acquire.lua),
// and what the nodes hand it, turned into one signal to look again.
//
// A release hands the lock, on each node, to the first ticket of that
// node's queue whose Locker listens (see release.lua): only that waiter is
// woken, and only its Locker's pub/sub connection hears it. Tickets are
// scored by when their waiter began to wait (the Locker's clock, the same
// score on every node), so the nodes agree on who is next and waiters are
// served about in order. A release deletes the lock on every node at once,
// and looking again at the first hand-off races the releases still on their
// way: so the waiter looks again as soon as a majority handed it the
// release, or settleDelay after the first hand-off when fewer do. A
// connection that failed or was subscribed again may have missed a hand-off
// (and the node may have dropped the ticket of a Locker it did not hear):
// that wakes the waiter at once, and its attempt registers its ticket there
// again.
//
// A hand-off can still go astray (the ticket of a waiter that has just
// left, a lost message, a queue lost in a restart): a waiter not woken for
// fallbackMin to twice that looks again anyway (less often as its wait
// goes on without hand-offs).
type releaseWatch struct {
	d      *driver // nil in unit tests: no tickets
	name   string
	keys   []string
	id     string // the waiter's id, the payload of its hand-offs
	ticket string // d.id + ":" + id
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
	deq      []bool     // nodes whose ticket a grant removed
	inflight []int      // requests on their way that may register the ticket, by node
	idle     *sync.Cond // on mu: a node's inflight fell to 0
}

func newReleaseWatch(nodes, quorum int) *releaseWatch {
	return &releaseWatch{quorum: quorum, c: make(chan struct{}, 1), heard: make([]bool, nodes),
		deq: make([]bool, nodes), inflight: make([]int, nodes)}
}

// newID returns 16 random hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// notify is called by node i's hub (with the hub's lock held): message is
// a hand-off, !message a connection that failed or was subscribed again.
func (w *releaseWatch) notify(i int, message bool) {
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
	if !w.heard[i] {
		w.heard[i] = true
		w.count++
	}
	if w.count >= w.quorum {
		w.fire()
		return
	}
	if !w.armed {
		w.arm(settleDelay)
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
// still have it (those from which no grant removed it): it returns once
// that is done on enough nodes that, with the nodes a grant removed it
// from, a majority no longer has it, so that a release after stop cannot
// reserve the lock for this waiter on a majority; the removals still
// running finish in the background, bounded by the node timeout.
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
	w.idle = sync.NewCond(&w.mu)
	w.mu.Unlock()
	w.d.unwatch(w)
	n := 0
	done := make(chan struct{}, len(clean))
	for i, nd := range w.d.nodes {
		if clean[i] {
			n++
			continue
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
			_ = nd.c.ZRem(nctx, w.keys[1], w.ticket).Err()
			done <- struct{}{}
		}()
	}
	for ; n < w.quorum; n++ {
		<-done
	}
}

// tickets returns, for an attempt on name, what acquire.lua takes of this
// Locker's waiters on it: their tickets between spaces, and their scores
// and tickets to register when the lock is busy; and, when there is
// exactly one, that waiter.
func (d *driver) tickets(name string) (string, []any, *releaseWatch) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	ws := d.watching[name]
	if len(ws) == 0 {
		return " ", nil, nil
	}
	var b strings.Builder
	b.WriteByte(' ')
	regs := make([]any, 0, 2*len(ws))
	var own *releaseWatch
	for w := range ws {
		b.WriteString(w.ticket)
		b.WriteByte(' ')
		regs = append(regs, w.score, w.ticket)
		own = w
	}
	if len(ws) > 1 {
		own = nil
	}
	return b.String(), regs, own
}

// maxGone bounds how many waiters that left a Locker remembers, to pass on
// hand-offs that reach them late (see missed).
const maxGone = 256

func (d *driver) unwatch(w *releaseWatch) {
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
	d.gone[w.id] = w.name
	d.goneIDs = append(d.goneIDs, w.id)
}

// missed is called by node i's hub for every hand-off this Locker hears
// (with the hub's lock held): a hand-off to a waiter that has left (its
// ticket was still in the queue) is passed on to the next waiter, in the
// background, so that the lock does not sit reserved for nobody while the
// others wait.
func (d *driver) missed(i int, id string) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.live[id] {
		return
	}
	name, ok := d.gone[id]
	if !ok || d.closing {
		return
	}
	keys := d.keys(name)
	nd := d.nodes[i]
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		nctx, cancel := nodeCtx(context.Background(), d.watchTimeout(), true)
		defer cancel()
		_ = passScript.Run(nctx, nd.c, keys[:3], d.id+":"+id, millis(reserveFor)).Err()
	}()
}

// watchTimeout bounds the queue requests of a waiter, which knows no TTL.
func (d *driver) watchTimeout() time.Duration {
	if d.nodeTimeout > 0 {
		return d.nodeTimeout
	}
	return MaxDefaultNodeTimeout
}
