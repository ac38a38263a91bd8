package dlock

import (
	"container/heap"
	"sync"
	"time"
)

// sched runs the leases' timed work (the watchdog's refreshes, the ends at
// ValidUntil) on one runtime timer per Locker.
//
// A lease that lives shorter than its refresh interval, the common case,
// then costs two heap operations and no timer at all: the runtime timer stays
// armed at the earliest deadline it has seen and is only moved when a task
// becomes due earlier. (A timer per lease costs a wake-up of the runtime's
// poller for every new earliest deadline, which is most of them: on a loaded
// machine, several µs of every acquire+release.) A task that is cancelled
// leaves the timer as it is; when it fires with nothing due it re-arms for
// the next task, or stays idle.
//
// Every due task runs in a goroutine of its own, counted in wg, so a refresh
// that hangs never delays an end at ValidUntil; close stops the timer, after
// which no task starts, and waits for the ones running.
//
// With batch set (a driver that refreshes many leases in one request), the
// watchdog ticks that are due, and those due within their slack, start
// together in one goroutine running batch; their next ticks then fall due
// together again.
type sched struct {
	mu     sync.Mutex
	tasks  taskHeap
	timer  *time.Timer
	armed  time.Time // when timer fires; zero when it is stopped
	closed bool
	wg     sync.WaitGroup
	batch  func([]*Lease) // set before the first task, never changed
}

// task is a function to run at a time; at most one run is pending. A
// lease's tasks are fields of the lease, with run a method expression, so
// that scheduling them allocates nothing.
type task struct {
	at  time.Time
	run func(*Lease)
	ls  *Lease
	i   int // index in the heap; -1 when not scheduled
	// slack, for a watchdog tick, is how much earlier than at it may run
	// with others in a batch; zero for other tasks.
	slack time.Duration
}

// maxSlack bounds task.slack.
const maxSlack = 50 * time.Millisecond

func newTask(f func()) *task { return &task{run: func(*Lease) { f() }, i: -1} }

func leaseTask(ls *Lease, run func(*Lease)) task { return task{run: run, ls: ls, i: -1} }

// schedule (re)schedules t to run at at, replacing a pending run.
func (s *sched) schedule(t *task, at time.Time) { s.scheduleSlack(t, at, 0) }

// scheduleSlack is schedule for a task that may run up to slack (at most
// maxSlack) before at in a batch.
func (s *sched) scheduleSlack(t *task, at time.Time, slack time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	t.at, t.slack = at, min(slack, maxSlack)
	if t.i >= 0 {
		heap.Fix(&s.tasks, t.i)
	} else {
		heap.Push(&s.tasks, t)
	}
	if s.armed.IsZero() || at.Before(s.armed) {
		s.arm(at)
	}
}

// cancel drops t's pending run, if any. A run already started goes on.
func (s *sched) cancel(t *task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.i >= 0 {
		heap.Remove(&s.tasks, t.i)
	}
}

// arm sets the timer to fire at at; s.mu held.
func (s *sched) arm(at time.Time) {
	s.armed = at
	d := time.Until(at)
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
		return
	}
	s.timer.Reset(d)
}

// fire starts every task that is due and re-arms for the next.
func (s *sched) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	now := time.Now()
	var batch, later []*task
	for len(s.tasks) > 0 {
		t := s.tasks[0]
		switch {
		case !t.at.After(now) && (s.batch == nil || t.slack == 0):
			heap.Pop(&s.tasks)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				t.run(t.ls)
			}()
			continue
		case s.batch == nil || t.at.After(now.Add(maxSlack)):
		case t.slack > 0 && !t.at.Add(-t.slack).After(now):
			batch = append(batch, heap.Pop(&s.tasks).(*task))
			continue
		default: // not due yet: put back below
			later = append(later, heap.Pop(&s.tasks).(*task))
			continue
		}
		break
	}
	for _, t := range later {
		heap.Push(&s.tasks, t)
	}
	if len(batch) > 0 {
		lss := make([]*Lease, len(batch))
		for i, t := range batch {
			lss[i] = t.ls
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.batch(lss)
		}()
	}
	s.armed = time.Time{}
	if len(s.tasks) > 0 {
		s.arm(s.tasks[0].at)
	}
}

// close stops the timer and waits for the tasks running; pending tasks never
// run.
func (s *sched) close() {
	s.mu.Lock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	for _, t := range s.tasks {
		t.i = -1
	}
	s.tasks = nil
	s.mu.Unlock()
	s.wg.Wait()
}

type taskHeap []*task

func (h taskHeap) Len() int           { return len(h) }
func (h taskHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h taskHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i = i
	h[j].i = j
}
func (h *taskHeap) Push(x any) {
	t := x.(*task)
	t.i = len(*h)
	*h = append(*h, t)
}
func (h *taskHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.i = -1
	*h = old[:len(old)-1]
	return t
}
