package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
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
// before it looks again anyway (and registers its ticket again): up to twice
// as long, at random. It bounds the wait of a waiter whose hand-off went
// astray (see releaseWatch).
const fallbackMin = 200 * time.Millisecond

// queueTTL is how long a waiters' queue outlives its last registration, so
// that tickets that nobody removed (their Locker died) do not stay forever.
const queueTTL = time.Minute

// releaseWatch is one waiter: its ticket in the name's queue on every node,
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
// that wakes the waiter at once and registers its ticket there again.
//
// A hand-off can still go astray (the ticket of a waiter that has just
// left, a lost message, a queue lost in a restart): a waiter not woken for
// fallbackMin to twice that looks again anyway and registers its ticket
// again on every node.
type releaseWatch struct {
	d      *driver // nil in unit tests: no tickets
	name   string
	keys   []string
	id     string // the waiter's id, the payload of its hand-offs
	ticket string // d.id + ":" + id
	score  float64
	quorum int
	c      chan struct{} // 1-buffered: look again

	mu       sync.Mutex
	heard    []bool // nodes that handed over a release since the last signal
	count    int
	timer    *time.Timer
	armed    bool // timer is set to signal
	fallback *time.Timer
	stopped  bool
	deq      []bool           // nodes whose ticket a grant removed
	inflight []int            // registrations on their way, by node
	pending  []sync.WaitGroup // registrations on their way, by node
}

func newReleaseWatch(nodes, quorum int) *releaseWatch {
	return &releaseWatch{quorum: quorum, c: make(chan struct{}, 1), heard: make([]bool, nodes),
		deq: make([]bool, nodes), inflight: make([]int, nodes), pending: make([]sync.WaitGroup, nodes)}
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
	if !message {
		w.fire()
		w.register(i)
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
	d := fallbackMin + mrand.N(fallbackMin)
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
	w.fire()
	for i := range w.d.nodes {
		w.register(i)
	}
}

// register adds the ticket to node i's queue, in the background, and
// returns where the result arrives (nil after stop); w.mu held.
func (w *releaseWatch) register(i int) <-chan error {
	if w.d == nil || w.stopped {
		return nil
	}
	done := make(chan error, 1)
	w.inflight[i]++
	w.pending[i].Add(1)
	w.d.bg.Add(1)
	go func() {
		defer w.d.bg.Done()
		defer w.pending[i].Done()
		err := w.enqueue(context.Background(), i)
		w.mu.Lock()
		w.inflight[i]--
		w.deq[i] = false // the ticket may be there again
		w.mu.Unlock()
		done <- err
	}()
	return done
}

// enqueue adds the ticket to node i's queue, keeping its score if it is
// there already, and extends the queue's life.
func (w *releaseWatch) enqueue(ctx context.Context, i int) error {
	nd := w.d.nodes[i]
	nctx, cancel := nodeCtx(ctx, w.d.watchTimeout(), true)
	defer cancel()
	_, err := nd.c.Pipelined(nctx, func(p goredis.Pipeliner) error {
		p.ZAddNX(nctx, w.keys[1], goredis.Z{Score: w.score, Member: w.ticket})
		p.PExpire(nctx, w.keys[1], queueTTL)
		return nil
	})
	return err
}

// dequeued records that a grant removed the ticket from node i's queue
// (unless a registration on its way may put it back).
func (w *releaseWatch) dequeued(i int) {
	w.mu.Lock()
	if w.inflight[i] == 0 {
		w.deq[i] = true
	}
	w.mu.Unlock()
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
	deq := slices.Clone(w.deq)
	w.mu.Unlock()
	w.d.unwatch(w)
	clean := 0
	done := make(chan struct{}, len(deq))
	for i, nd := range w.d.nodes {
		if deq[i] {
			clean++
			continue
		}
		w.d.bg.Add(1)
		go func() {
			defer w.d.bg.Done()
			w.pending[i].Wait() // a registration on its way must not land after the removal
			nctx, cancel := nodeCtx(context.Background(), w.d.watchTimeout(), true)
			defer cancel()
			_ = nd.c.ZRem(nctx, w.keys[1], w.ticket).Err()
			done <- struct{}{}
		}()
	}
	for ; clean < w.quorum; clean++ {
		<-done
	}
}

// tickets returns, for an attempt on name, the tickets of this Locker's
// waiters on it (see acquire.lua) and, when there is exactly one, that
// waiter.
func (d *driver) tickets(name string) (string, *releaseWatch) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	ws := d.watching[name]
	if len(ws) == 0 {
		return " ", nil
	}
	var b strings.Builder
	b.WriteByte(' ')
	for w := range ws {
		b.WriteString(w.ticket)
		b.WriteByte(' ')
	}
	if len(ws) == 1 {
		for w := range ws {
			return b.String(), w
		}
	}
	return b.String(), nil
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
