package memqueue

import (
	"container/heap"
	"context"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"time"
	"weak"

	"github.com/dlock/dlock/memory"
	"github.com/dlock/dlock/queue"
	qdriver "github.com/dlock/dlock/queue/driver"
)

func init() {
	qdriver.Register("mem", func(ctx context.Context, u *url.URL) (qdriver.Driver, error) {
		s, _, err := memory.ParseURL(u)
		if err != nil {
			return nil, err
		}
		return &taskDriver{s: stateOf(s), link: memory.NewLink()}, nil
	})
}

// NewQueue returns a task-queue Client on the store s (nil: the default
// store), the in-process reference for package queue: what mem:// URLs
// open. Link, as for locks, lets tests partition or reset it.
func NewQueue(s *memory.Store, link *memory.Link) *queue.Client {
	if s == nil {
		s = memory.NamedStore("")
	}
	if link == nil {
		link = memory.NewLink()
	}
	return queue.New(&taskDriver{s: stateOf(s), link: link})
}

// store is the task queues of one memory.Store.
type store struct {
	mu     sync.Mutex
	queues map[string]*taskQueue
}

// stores holds the task queues of each memory.Store that has any, for as
// long as the Store is reachable.
var (
	storesMu sync.Mutex
	stores   = map[weak.Pointer[memory.Store]]*store{}
)

// stateOf returns the task queues of s.
func stateOf(s *memory.Store) *store {
	storesMu.Lock()
	defer storesMu.Unlock()
	k := weak.Make(s)
	st := stores[k]
	if st == nil {
		st = &store{queues: map[string]*taskQueue{}}
		stores[k] = st
		runtime.AddCleanup(s, func(k weak.Pointer[memory.Store]) {
			storesMu.Lock()
			defer storesMu.Unlock()
			delete(stores, k)
		}, k)
	}
	return st
}

// taskQueue is one queue's state in a store, under the store's lock. Its
// waiting tasks are indexed by due time and its claimed ones by claim
// expiry, so that a claim, pop or ack costs O(log n) in the queue's length.
type taskQueue struct {
	tasks    map[string]*memTask
	waiting  taskHeap // waiting tasks, by due time then id
	claimed  taskHeap // claimed tasks, by claim expiry
	watchers map[chan struct{}]struct{}
}

type memTask struct {
	id       string
	due      time.Time // when waiting: when it is due
	payload  []byte
	attempts int
	token    string    // "" unless claimed
	until    time.Time // claimed: the claim's deadline
	dead     time.Time // not zero: dead-lettered then
	wi, ci   int       // index in taskQueue.waiting, .claimed; -1 when not there
}

// taskHeap is a container/heap of tasks ordered by less, each task keeping
// its index (through idx) for heap.Fix and heap.Remove.
type taskHeap struct {
	ts   []*memTask
	less func(a, b *memTask) bool
	idx  func(t *memTask) *int
}

func (h *taskHeap) Len() int           { return len(h.ts) }
func (h *taskHeap) Less(i, j int) bool { return h.less(h.ts[i], h.ts[j]) }
func (h *taskHeap) Swap(i, j int) {
	h.ts[i], h.ts[j] = h.ts[j], h.ts[i]
	*h.idx(h.ts[i]), *h.idx(h.ts[j]) = i, j
}
func (h *taskHeap) Push(x any) {
	t := x.(*memTask)
	*h.idx(t) = len(h.ts)
	h.ts = append(h.ts, t)
}
func (h *taskHeap) Pop() any {
	t := h.ts[len(h.ts)-1]
	h.ts[len(h.ts)-1] = nil
	h.ts = h.ts[:len(h.ts)-1]
	*h.idx(t) = -1
	return t
}

// top is the heap's first task, or nil.
func (h *taskHeap) top() *memTask {
	if len(h.ts) == 0 {
		return nil
	}
	return h.ts[0]
}

// remove takes t out of the heap if it is there.
func (h *taskHeap) remove(t *memTask) {
	if i := *h.idx(t); i >= 0 {
		heap.Remove(h, i)
	}
}

// dueOrder orders waiting tasks: by due time, then by id.
func dueOrder(a, b *memTask) bool {
	if c := a.due.Compare(b.due); c != 0 {
		return c < 0
	}
	return a.id < b.id
}

func newTaskQueue() *taskQueue {
	return &taskQueue{
		tasks:    map[string]*memTask{},
		waiting:  taskHeap{less: dueOrder, idx: func(t *memTask) *int { return &t.wi }},
		claimed:  taskHeap{less: func(a, b *memTask) bool { return a.until.Before(b.until) }, idx: func(t *memTask) *int { return &t.ci }},
		watchers: map[chan struct{}]struct{}{},
	}
}

// add puts a new waiting task in the queue, replacing any task of its id
// (a dead one: see Enqueue).
func (q *taskQueue) add(t *memTask) {
	if old := q.tasks[t.id]; old != nil {
		q.drop(old)
	}
	t.wi, t.ci = -1, -1
	q.tasks[t.id] = t
	heap.Push(&q.waiting, t)
}

// wait makes t a waiting task, due at due (ending its claim if it has one).
func (q *taskQueue) wait(t *memTask, due time.Time) {
	q.claimed.remove(t)
	t.token, t.until, t.dead, t.due = "", time.Time{}, time.Time{}, due
	if t.wi >= 0 {
		heap.Fix(&q.waiting, t.wi)
	} else {
		heap.Push(&q.waiting, t)
	}
}

// claim gives waiting task t a claim with token until until.
func (q *taskQueue) claim(t *memTask, token string, until time.Time) {
	q.waiting.remove(t)
	t.token, t.until = token, until
	heap.Push(&q.claimed, t)
}

// kill dead-letters t at now.
func (q *taskQueue) kill(t *memTask, now time.Time) {
	q.waiting.remove(t)
	q.claimed.remove(t)
	t.token, t.until, t.dead = "", time.Time{}, now
}

// drop removes t from the queue.
func (q *taskQueue) drop(t *memTask) {
	q.waiting.remove(t)
	q.claimed.remove(t)
	delete(q.tasks, t.id)
}

func (t *memTask) waiting() bool { return t.token == "" && t.dead.IsZero() }

type taskDriver struct {
	s    *store
	link *memory.Link
}

// q returns the named queue, creating it; s.mu held.
func (d *taskDriver) q(name string) *taskQueue {
	q := d.s.queues[name]
	if q == nil {
		q = newTaskQueue()
		d.s.queues[name] = q
	}
	return q
}

// do runs op on the queue under the store's lock, across the link. now is
// the store's clock, unrounded: due times and deadlines are compared with
// it as they are, and counted from it with after.
func (d *taskDriver) do(ctx context.Context, name string, op func(q *taskQueue, now time.Time)) error {
	return d.link.Do(ctx, func() error {
		d.s.mu.Lock()
		defer d.s.mu.Unlock()
		op(d.q(name), time.Now())
		return nil
	})
}

// after is the due time or deadline dur after now, to the millisecond as
// a server keeps it, rounded the safe way (up; see package queue/driver's
// Rounding); with no delay, now rounded down: due at once.
func after(now time.Time, dur time.Duration) time.Time {
	if dur == 0 {
		return now.Truncate(time.Millisecond)
	}
	return qdriver.UpMilli(now).Add(time.Duration(qdriver.Millis(dur)) * time.Millisecond)
}

func (q *taskQueue) wake() {
	for c := range q.watchers {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

func copyTask(t *memTask, due time.Time) qdriver.Task {
	return qdriver.Task{ID: t.id, Due: due, Payload: slices.Clone(t.payload), Attempts: t.attempts}
}

func (d *taskDriver) Enqueue(ctx context.Context, name string, r qdriver.EnqueueRequest) (qdriver.Result, error) {
	var res qdriver.Result
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		due := after(now, r.Delay)
		if !r.At.IsZero() {
			due = qdriver.UpMilli(r.At)
		}
		t := q.tasks[r.ID]
		switch {
		case t == nil || !t.dead.IsZero():
			q.add(&memTask{id: r.ID, due: due, payload: slices.Clone(r.Payload)})
			res = qdriver.Added
		case r.Mode == qdriver.Keep:
			res = qdriver.Kept
			return
		default:
			q.wait(t, due)
			res = qdriver.Rescheduled
			if r.Mode == qdriver.Replace {
				t.payload, res = slices.Clone(r.Payload), qdriver.Replaced
			}
		}
		q.wake()
	})
	return res, err
}

// recover makes expired claims due again (at their expiry), or dead when
// they have had max deliveries (max 0: no dead-lettering, for Peek and
// Pop); now is the store's clock.
func (q *taskQueue) recover(now time.Time, max int) {
	for t := q.claimed.top(); t != nil && !t.until.After(now); t = q.claimed.top() {
		if max > 0 && t.attempts >= max {
			q.kill(t, now)
			continue
		}
		q.wait(t, t.until)
	}
}

// next returns the first waiting task if it is due at now, else nil.
func (q *taskQueue) next(now time.Time) *memTask {
	if t := q.waiting.top(); t != nil && !t.due.After(now) {
		return t
	}
	return nil
}

// until returns the wait until the next due time or claim expiry after now
// (negative for none).
func (q *taskQueue) until(now time.Time) time.Duration {
	next := time.Time{}
	if t := q.waiting.top(); t != nil {
		next = t.due
	}
	if t := q.claimed.top(); t != nil && (next.IsZero() || t.until.Before(next)) {
		next = t.until
	}
	if next.IsZero() {
		return -1
	}
	return max(next.Sub(now), 0)
}

func (d *taskDriver) Peek(ctx context.Context, name string, n int) ([]qdriver.Task, error) {
	var out []qdriver.Task
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		q.recover(now, 0)
		// Take the first n due tasks off the index, then put them back.
		var taken []*memTask
		for t := q.next(now); t != nil && len(taken) < n; t = q.next(now) {
			taken = append(taken, heap.Pop(&q.waiting).(*memTask))
			out = append(out, copyTask(t, t.due))
		}
		for _, t := range taken {
			heap.Push(&q.waiting, t)
		}
	})
	return out, err
}

func (d *taskDriver) Pop(ctx context.Context, name string, n int) ([]qdriver.Task, time.Duration, error) {
	var out []qdriver.Task
	var wait time.Duration
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		q.recover(now, 0)
		for t := q.next(now); t != nil && len(out) < n; t = q.next(now) {
			out = append(out, copyTask(t, t.due))
			q.drop(t)
		}
		wait = q.until(now)
	})
	return out, wait, err
}

func (d *taskDriver) Claim(ctx context.Context, name string, n int, visibility time.Duration, maxAttempts int) ([]qdriver.Claimed, time.Duration, error) {
	var out []qdriver.Claimed
	var wait time.Duration
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		q.recover(now, maxAttempts)
		for t := q.next(now); t != nil && len(out) < n; t = q.next(now) {
			t.attempts++
			q.claim(t, qdriver.NewToken(), after(now, visibility))
			out = append(out, qdriver.Claimed{Task: copyTask(t, t.due), Token: t.token})
		}
		wait = q.until(now)
	})
	return out, wait, err
}

// current returns the task if token's claim on it is current; q held.
func (q *taskQueue) current(id, token string, now time.Time) *memTask {
	t := q.tasks[id]
	if t == nil || t.token != token || !t.until.After(now) {
		return nil
	}
	return t
}

func (d *taskDriver) Ack(ctx context.Context, name, id, token string) (bool, error) {
	var ok bool
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		if t := q.current(id, token, now); t != nil {
			q.drop(t)
			ok = true
		}
	})
	return ok, err
}

func (d *taskDriver) Extend(ctx context.Context, name, id, token string, ext time.Duration) (bool, error) {
	var ok bool
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		if t := q.current(id, token, now); t != nil {
			t.until, ok = after(now, ext), true
			heap.Fix(&q.claimed, t.ci)
		}
	})
	return ok, err
}

func (d *taskDriver) Nack(ctx context.Context, name, id, token string, delay time.Duration, maxAttempts int) (bool, error) {
	var ok bool
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		t := q.current(id, token, now)
		if t == nil {
			return
		}
		ok = true
		if maxAttempts > 0 && t.attempts >= maxAttempts {
			q.kill(t, now)
			return
		}
		q.wait(t, after(now, delay))
		q.wake()
	})
	return ok, err
}

func (d *taskDriver) Delete(ctx context.Context, name, id string, due time.Time) (bool, error) {
	var ok bool
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		if t := q.tasks[id]; t != nil && t.waiting() && t.due.Equal(qdriver.UpMilli(due)) {
			q.drop(t)
			ok = true
		}
	})
	return ok, err
}

func (d *taskDriver) Stats(ctx context.Context, name string) (qdriver.Stats, error) {
	var s qdriver.Stats
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		for _, t := range q.tasks {
			switch {
			case !t.dead.IsZero():
				s.Dead++
			case t.token != "" && t.until.After(now):
				s.Claimed++
			case t.token != "" || !t.due.After(now):
				s.Due++
			default:
				s.Delayed++
			}
		}
	})
	return s, err
}

func (d *taskDriver) Dead(ctx context.Context, name string, n int) ([]qdriver.Task, error) {
	var out []qdriver.Task
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		var dead []*memTask
		for _, t := range q.tasks {
			if !t.dead.IsZero() {
				dead = append(dead, t)
			}
		}
		slices.SortFunc(dead, func(a, b *memTask) int { return a.dead.Compare(b.dead) })
		for _, t := range dead[:min(n, len(dead))] {
			out = append(out, copyTask(t, t.due))
		}
	})
	return out, err
}

func (d *taskDriver) Requeue(ctx context.Context, name, id string, delay time.Duration) (bool, error) {
	var ok bool
	err := d.do(ctx, name, func(q *taskQueue, now time.Time) {
		if t := q.tasks[id]; t != nil && !t.dead.IsZero() {
			t.attempts, ok = 0, true
			q.wait(t, after(now, delay))
			q.wake()
		}
	})
	return ok, err
}

func (d *taskDriver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	err := d.link.Do(ctx, func() error {
		d.s.mu.Lock()
		defer d.s.mu.Unlock()
		d.q(name).watchers[c] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return c, func() {
		once.Do(func() {
			d.s.mu.Lock()
			defer d.s.mu.Unlock()
			delete(d.q(name).watchers, c)
		})
	}, nil
}

func (d *taskDriver) Close() error { return nil }

// QueuedIDs lists the ids of every task the store keeps for the queue (due,
// delayed, claimed or dead), for tests.
func QueuedIDs(store *memory.Store, queue string) []string {
	s := stateOf(store)
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	if q := s.queues[queue]; q != nil {
		for id := range q.tasks {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
