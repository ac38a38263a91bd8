package dlock

import (
	"sync"
	"testing"
	"time"
)

// Tasks run in the order of their times, each no earlier than its time; a
// cancelled task never runs; rescheduling replaces the pending run.
func TestSchedOrderAndCancel(t *testing.T) {
	var s sched
	defer s.close()
	start := time.Now()
	var mu sync.Mutex
	var order []string
	ran := make(chan string, 4)
	add := func(name string, after time.Duration) *task {
		var tk *task
		tk = newTask(func() {
			if now := time.Now(); now.Before(tk.at) {
				t.Errorf("%s ran %v before its time", name, tk.at.Sub(now))
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			ran <- name
		})
		s.schedule(tk, start.Add(after))
		return tk
	}
	late := add("late", 60*time.Millisecond)
	add("first", 20*time.Millisecond)
	dropped := add("dropped", 10*time.Millisecond)
	s.cancel(dropped)
	moved := add("moved", time.Hour)
	s.schedule(moved, start.Add(40*time.Millisecond)) // earlier than the armed time

	for range 3 {
		select {
		case <-ran:
		case <-time.After(5 * time.Second):
			t.Fatalf("tasks run so far: %v; want first, moved, late", order)
		}
	}
	mu.Lock()
	got := order
	mu.Unlock()
	if want := []string{"first", "moved", "late"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("order %v, want %v", got, want)
	}
	s.cancel(late) // after its run: a no-op
	if dropped.i != -1 || late.i != -1 {
		t.Errorf("heap indexes %d, %d after run and cancel; want -1", dropped.i, late.i)
	}
}

// close waits for a task that is running and drops the pending ones.
func TestSchedCloseWaits(t *testing.T) {
	var s sched
	started, release := make(chan struct{}), make(chan struct{})
	finished := false
	s.schedule(newTask(func() {
		close(started)
		<-release
		finished = true
	}), time.Now())
	pending := newTask(func() { t.Error("a task pending at close ran") })
	s.schedule(pending, time.Now().Add(20*time.Millisecond))
	<-started
	go func() {
		time.Sleep(10 * time.Millisecond) // let close start waiting
		close(release)
	}()
	s.close()
	if !finished {
		t.Error("close returned before the running task finished")
	}
	s.schedule(pending, time.Now()) // after close: ignored
	s.cancel(pending)
	time.Sleep(40 * time.Millisecond) // past the pending task's time
}
