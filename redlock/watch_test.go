package redlock

import (
	"testing"
	"time"
)

// A waiter is woken as the majority-th node hands it a release, once
// however many more nodes do; handed a release by fewer than a majority, it
// is woken settleDelay after the first.
func TestReleaseWatchWake(t *testing.T) {
	w := newReleaseWatch(5, 3)
	defer w.stop()
	for i := range 2 {
		w.notify(i, true)
	}
	select {
	case <-w.c:
		t.Fatal("woken by two of five nodes at once")
	default:
	}
	w.notify(2, true)
	select {
	case <-w.c:
	default:
		t.Fatal("no wake as the third of five nodes handed over the release")
	}
	w.notify(3, true)
	w.notify(4, true)
	start := time.Now()
	select {
	case <-w.c:
	case <-time.After(time.Second):
		t.Fatal("no wake within 1s of two nodes handing over a release")
	}
	if took := time.Since(start); took < settleDelay/2 {
		t.Errorf("woken %v after a minority's hand-off; want about settleDelay %v", took, settleDelay)
	}
	select {
	case <-w.c:
		t.Error("two wakes for one release")
	case <-time.After(3 * settleDelay):
	}
}
