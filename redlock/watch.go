package redlock

import (
	"sync"
	"time"

	"github.com/dlock/dlock/internal/redishub"
)

// settleDelay is how long a waiter that has heard a release from fewer than
// a majority of nodes waits for the others before it looks again.
const settleDelay = 10 * time.Millisecond

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
type releaseWatch struct {
	quorum int
	c      chan struct{} // 1-buffered: look again

	mu      sync.Mutex
	heard   []bool // nodes that announced a release since the last signal
	count   int
	timer   *time.Timer
	armed   bool // timer is set to signal
	stopped bool
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
		w.fire()
		return
	}
	if !w.armed {
		w.armed = true
		if w.timer == nil {
			w.timer = time.AfterFunc(settleDelay, w.settled)
		} else {
			w.timer.Reset(settleDelay)
		}
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
