package mysqlqueue

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

// Waking waiters. MySQL and MariaDB have no LISTEN/NOTIFY, so a Client
// with a ClaimWait or PopWait waiting polls: one goroutine per Client,
// running while anyone waits (and pollLinger after), asks every
// PollInterval, in one statement for all the queues waited on, for each
// queue's next due time and claim deadline (two index dives per queue).
// It signals a queue's waiters when a task is due, or when the next due
// time is not the one it saw last (a task enqueued with a delay shorter
// than the wait its waiters were told), so that they look again and wait
// for it on a timer, to the ms. A failed poll signals
// every waiter: their next attempt reports the error. An Enqueue, Nack or
// Requeue through this Client wakes one of its waiters of that queue at
// once, without waiting for the poll.

// The poll's interval starts at pollMin when a waiter arrives or a poll
// saw a new next due time, and doubles at each poll that did not, up to
// PollInterval (a task due but locked by another transaction, or a failed
// poll, signals the waiters but does not hurry the polls):
// a worker back from a task, waiting again, learns of the next one soon
// after it is enqueued. (At a fixed 50ms, a producer that enqueued a task
// delayed 20ms just after a worker began to wait, the worker woken by the
// previous poll, saw it claimed 27ms after it was due at the median: the
// polls kept step with the worker and always came after the due time.)
const pollMin = 5 * time.Millisecond

// pollLinger is how long the poller stays after the last waiter left, so
// that waits in a loop do not start one each.
const pollLinger = 2 * time.Second

// pollBatch bounds the queues one poll statement asks about.
const pollBatch = 50

// watcher is the waiters of one driver, by queue, and its poller.
type watcher struct {
	d *taskDriver

	mu      sync.Mutex
	queues  map[string]*watched
	running bool // a poller runs
	closed  bool
	kick    chan struct{}      // a waiter arrived: poll soon
	stop    context.CancelFunc // the running poller's
	wg      sync.WaitGroup
}

// watched is one queue's waiters and what the poller last saw of it.
type watched struct {
	chans map[chan struct{}]struct{}
	seen  bool  // next is known
	next  int64 // the earliest due time or claim deadline, ms; -1 for none
}

func (d *taskDriver) Watch(ctx context.Context, qn string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	w := &d.w
	c := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, nil, dlock.ErrClosed
	}
	if w.queues == nil {
		w.queues = map[string]*watched{}
	}
	q := w.queues[qn]
	if q == nil {
		q = &watched{chans: map[chan struct{}]struct{}{}}
		w.queues[qn] = q
	}
	q.chans[c] = struct{}{}
	if w.kick == nil {
		w.kick = make(chan struct{}, 1)
	}
	signal(w.kick)
	if !w.running {
		pctx, cancel := context.WithCancel(context.Background())
		w.running, w.stop = true, cancel
		w.wg.Add(1)
		go w.poll(pctx)
	}
	var once sync.Once
	return c, func() { once.Do(func() { w.unwatch(qn, c) }) }, nil
}

func (w *watcher) unwatch(qn string, c chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queues[qn]
	if q == nil {
		return
	}
	delete(q.chans, c)
	select {
	case <-c: // a wake-up this waiter did not act on: another's
		w.wakeOneLocked(qn)
	default:
	}
}

// wakeOne signals one waiter of the queue that has no signal pending, for
// a change through this driver that made a task due: one waiter takes it.
// When every waiter has one pending, all are awake and each will look.
func (w *watcher) wakeOne(qn string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeOneLocked(qn)
}

func (w *watcher) wakeOneLocked(qn string) {
	q := w.queues[qn]
	if q == nil {
		return
	}
	for c := range q.chans {
		if len(c) == 0 {
			signal(c)
			return
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// poll asks for the next due times of the queues waited on every
// PollInterval until ctx ends or nobody has waited for pollLinger.
func (w *watcher) poll(ctx context.Context) {
	defer w.wg.Done()
	w.mu.Lock()
	kick := w.kick
	w.mu.Unlock()
	every := min(pollMin, w.d.poll)
	t := time.NewTimer(every)
	defer t.Stop()
	var idleSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
			if every > pollMin {
				every = min(pollMin, w.d.poll)
				t.Reset(every)
			}
			continue
		case <-t.C:
		}
		w.mu.Lock()
		var names []string
		for qn, q := range w.queues {
			if len(q.chans) > 0 {
				names = append(names, qn)
			}
		}
		if len(names) == 0 {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if time.Since(idleSince) >= pollLinger {
				w.running, w.queues = false, nil
				w.stop()
				w.mu.Unlock()
				return
			}
			w.mu.Unlock()
			every = w.d.poll
			t.Reset(every)
			continue
		}
		idleSince = time.Time{}
		w.mu.Unlock()
		signalled := false // a new next due time
		for len(names) > 0 {
			batch := names[:min(pollBatch, len(names))]
			names = names[len(batch):]
			qctx, cancel := context.WithTimeout(ctx, max(10*w.d.poll, 5*time.Second))
			got, err := w.d.nexts(qctx, batch)
			cancel()
			w.mu.Lock()
			for _, qn := range batch {
				q := w.queues[qn]
				if q == nil {
					continue
				}
				nx, ok := got[qn]
				if err != nil || !ok {
					q.seen = false
					wakeAll(q)
					continue
				}
				first := int64(-1)
				for _, v := range []sql.NullInt64{nx.waiting, nx.claimed} {
					if v.Valid && (first < 0 || v.Int64 < first) {
						first = v.Int64
					}
				}
				changed := !q.seen || first != q.next
				if first >= 0 && (changed || first*1000 <= nx.nowUS) {
					wakeAll(q)
				}
				signalled = signalled || changed && first >= 0
				q.seen, q.next = true, first
			}
			w.mu.Unlock()
		}
		if signalled {
			every = min(pollMin, w.d.poll)
		} else {
			every = min(2*every, w.d.poll)
		}
		t.Reset(every)
	}
}

func wakeAll(q *watched) {
	for c := range q.chans {
		signal(c)
	}
}

// nexts runs nextSQL for each queue, in one statement.
func (d *taskDriver) nexts(ctx context.Context, queues []string) (map[string]next, error) {
	var (
		b    strings.Builder
		args []any
	)
	for i, qn := range queues {
		if i > 0 {
			b.WriteString("\nUNION ALL\n")
		}
		b.WriteString("SELECT CAST(? AS BINARY), ")
		b.WriteString(strings.TrimPrefix(nextSQL, "SELECT "))
		args = append(args, qn, qn, qn)
	}
	rows, err := d.db.QueryContext(ctx, d.q(b.String()), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]next, len(queues))
	for rows.Next() {
		var (
			qn string
			n  next
		)
		if err := rows.Scan(&qn, &n.waiting, &n.claimed, &n.nowUS); err != nil {
			return nil, err
		}
		out[qn] = n
	}
	return out, rows.Err()
}

// close stops the poller and waits for it.
func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	if w.running {
		w.stop()
	}
	w.mu.Unlock()
	w.wg.Wait()
}
