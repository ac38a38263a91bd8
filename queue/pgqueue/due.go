package pgqueue

import (
	"slices"
	"sync"
	"time"
)

// Waking on time. A waiting Claim or Pop (queue.Client's wait loop) sleeps
// on a Go timer until the next due time the driver reported. Go's timers
// wake an idle process through its network poller, which sleeps in whole
// milliseconds: a timer fires up to a millisecond late, about 0.6ms at the
// median on loopback, which is more than the Claim's own round trip. So the
// driver reports a wait shortened by earlyWake, remembers when the task is
// really due, and when the waiter comes back with its next Claim or Pop
// before then, sleeps the rest in the kernel (sleepPrecisely: a thread
// blocked in nanosleep, woken to within about 0.1ms; no CPU spent) and
// only then sends its statement. If a wake-up signal came from the
// listener meanwhile, the waiter may have come back for a task enqueued
// due now: it does not sleep.
//
// Nothing here decides what is due: the statement does, on the server's
// clock, so a waiter that comes back early finds nothing and is told the
// new wait; a task is never claimed early.

// earlyWake is how much sooner than the due time a waiting Claim or Pop is
// told to come back: a Go timer's lateness (under 1ms) and some slack.
const earlyWake = 1500 * time.Microsecond

// dueWakes remembers, per queue, the due times a Claim or Pop has reported
// shortened, for the caller's next call.
type dueWakes struct {
	mu      sync.Mutex
	pending map[string][]dueWake
	signals uint64 // wake-up signals sent to waiters so far
}

type dueWake struct {
	at      time.Time // when the task is due, on this process's clock
	signals uint64    // dueWakes.signals when the wait was measured
}

// signalled counts a wake-up signal sent to waiters.
func (w *dueWakes) signalled() {
	w.mu.Lock()
	w.signals++
	w.mu.Unlock()
}

// mark returns the signal count, to be passed to report.
func (w *dueWakes) mark() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.signals
}

// report records that the queue's next task is due after wait (counted
// from now) as measured by a statement sent when the signal count was
// mark, and returns the wait to report: earlyWake shorter, never negative.
func (w *dueWakes) report(queue string, wait time.Duration, mark uint64) time.Duration {
	at := time.Now().Add(wait)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == nil {
		w.pending = map[string][]dueWake{}
	}
	if len(w.pending) >= 64 { // waiters that never came back: forget what has passed
		now := time.Now()
		for q, ps := range w.pending {
			ps = slices.DeleteFunc(ps, func(p dueWake) bool { return !p.at.After(now) })
			if len(ps) == 0 {
				delete(w.pending, q)
			} else {
				w.pending[q] = ps
			}
		}
	}
	w.pending[queue] = append(w.pending[queue], dueWake{at: at, signals: mark})
	return max(wait-earlyWake, 0)
}

// await is called before a Claim or Pop on the queue: if a due time
// reported earlier is still ahead (by no more than earlyWake and some
// slack) and no wake-up signal was sent since it was measured, it sleeps
// until then. It forgets that due time, and any that have passed.
func (w *dueWakes) await(queue string) {
	w.mu.Lock()
	now := time.Now()
	var (
		next  dueWake
		found bool
		keep  = w.pending[queue][:0]
	)
	for _, p := range w.pending[queue] {
		switch {
		case !p.at.After(now):
		case !found || p.at.Before(next.at):
			if found {
				keep = append(keep, next)
			}
			next, found = p, true
		default:
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		delete(w.pending, queue)
	} else {
		w.pending[queue] = keep
	}
	signals := w.signals
	w.mu.Unlock()
	if found && next.signals == signals {
		if d := next.at.Sub(now); d <= 2*earlyWake {
			sleepPrecisely(d)
		}
	}
}
