package pgqueue

import (
	"fmt"
	"testing"
	"time"
)

// dueWakes: a reported wait comes back earlyWake shorter; the next call
// sleeps until the due time (never returning before it), unless a wake-up
// signal came meanwhile; a due time is used once, and passed ones are
// forgotten.
func TestDueWakes(t *testing.T) {
	var w dueWakes
	const wait = 3 * time.Millisecond
	if got := w.report("q", wait, w.mark()); got != wait-earlyWake {
		t.Errorf("report(%v): got %v, want %v", wait, got, wait-earlyWake)
	}
	if got := w.report("q", time.Millisecond, w.mark()); got != 0 {
		t.Errorf("report(1ms): got %v, want 0", got)
	}
	start := time.Now()
	w.await("q") // the 1ms one, the earliest
	if d := time.Since(start); d < 900*time.Microsecond {
		t.Errorf("await returned after %v, before the due time (1ms)", d)
	}
	w.await("q") // the 3ms one
	if d := time.Since(start); d < wait-100*time.Microsecond {
		t.Errorf("await returned after %v, before the due time (%v)", d, wait)
	}
	if n := len(w.pending["q"]); n != 0 {
		t.Errorf("%d due times left, want none", n)
	}

	// A signal since the wait was measured: no sleep.
	w.report("q", 50*time.Millisecond, w.mark())
	w.signalled()
	start = time.Now()
	w.await("q")
	if d := time.Since(start); d > 10*time.Millisecond {
		t.Errorf("await after a signal slept %v, want no sleep", d)
	}

	// Too far ahead (the waiter came back for another reason): no sleep,
	// and the due time is used up.
	w.report("q", time.Second, w.mark())
	start = time.Now()
	w.await("q")
	if d := time.Since(start); d > 10*time.Millisecond {
		t.Errorf("await 1s ahead slept %v, want no sleep", d)
	}
	if n := len(w.pending); n != 0 {
		t.Errorf("%d queues with due times left, want none", n)
	}
}

// Due times of waiters that never came back are forgotten once passed,
// when many queues have some.
func TestDueWakesForgetsAbandoned(t *testing.T) {
	var w dueWakes
	for i := range 100 {
		w.report(fmt.Sprint("q", i), time.Microsecond, w.mark())
	}
	time.Sleep(time.Millisecond)
	w.report("last", time.Hour, w.mark())
	if n := len(w.pending); n > 64 {
		t.Errorf("%d queues with due times, want at most 64", n)
	}
}
