package redlock

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/redishub"
)

// settleDelay is how long a waiter that has heard a release from fewer than
// a majority of nodes waits for the others before it looks again.
const settleDelay = 10 * time.Millisecond

// staggerMax bounds the random delay before a waiter that has already been
// woken once, and lost, looks again after a release (see releaseWatch).
const staggerMax = 2 * time.Millisecond

// releaseWatch turns what a waiter's subscriptions on every node hear into
// one signal to look again.
//
// A release deletes the lock on every node at once, and each node announces
// it. Looking again at the first announcement races the releases still on
// their way to the other nodes: such an attempt finds some nodes still held
// and, with a node down, cannot be decided until that node's timeout. So a
// waiter looks again as soon as a majority of nodes have announced a release
// (from then on a majority is free), or settleDelay after the first
// announcement when fewer do (the holder may have held no more than a
// majority, not all of which the waiter hears). A connection that failed or
// was subscribed again may have missed an announcement: that wakes the
// waiter at once.
//
// Staggering: every waiter hears the same release, and if all looked again
// at once they would split the vote among themselves and with the releaser
// coming back. A waiter's first wake is immediate (a lone waiter takes the
// lock one round trip after the release), but a waiter woken before, which
// is still waiting because another took the lock, has met other waiters:
// from then on it looks again after a random delay of up to staggerMax once
// a majority announced a release, so that the waiters come one after
// another and those behind the first find the lock held instead of
// splitting it.
type releaseWatch struct {
	quorum int
	c      chan struct{} // 1-buffered: look again

	mu      sync.Mutex
	heard   []bool // nodes that announced a release since the last signal
	count   int
	timer   *time.Timer
	armed   bool // timer is set to signal
	stopped bool
	fires   int // signals so far
}

func newReleaseWatch(nodes, quorum int) *releaseWatch {
	return &releaseWatch{quorum: quorum, c: make(chan struct{}, 1), heard: make([]bool, nodes)}
}

// notify is called by node i's hub (with the hub's lock held).
func (w *releaseWatch) notify(i int, message bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if !message {
		w.fire()
		return
	}
	if !w.heard[i] {
		w.heard[i] = true
		w.count++
	}
	if w.count >= w.quorum {
		switch {
		case w.fires == 0:
			w.fire()
		case w.count == w.quorum:
			w.arm(rand.N(staggerMax))
		}
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
	w.fires++
	clear(w.heard)
	w.count = 0
	if w.armed {
		w.armed = false
		w.timer.Stop()
	}
	redishub.Signal(w.c)
}

// stop silences the watch.
func (w *releaseWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}
