package redlock

import (
	"testing"
	"time"
)

// A waiter's first wake comes as the majority-th node announces a release;
// once woken, a waiter still waiting is woken by the next release after a
// random delay of at most staggerMax, and only once however many more nodes
// announce it.
func TestReleaseWatchStagger(t *testing.T) {
	w := newReleaseWatch(5, 3)
	defer w.stop()
	for i := range 3 {
		w.notify(i, true)
	}
	select {
	case <-w.c:
	default:
		t.Fatal("no wake as the third of five nodes announced the first release")
	}
	start := time.Now()
	for i := range 5 {
		w.notify(i, true)
	}
	select {
	case <-w.c:
	case <-time.After(time.Second):
		t.Fatal("no wake within 1s of the second release")
	}
	if took := time.Since(start); took > staggerMax+200*time.Millisecond {
		t.Errorf("second wake after %v; want within staggerMax %v (+200ms slack)", took, staggerMax)
	}
	select {
	case <-w.c:
		t.Error("two wakes for one release")
	case <-time.After(3 * staggerMax):
	}
}
