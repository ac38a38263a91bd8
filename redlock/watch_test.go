package redlock

import (
	"testing"
	"time"
)

// A waiter is woken as the majority-th node tells it of a release, once
// however many more nodes do; told by fewer than a majority, it is woken
// settleDelay after the first.
func TestReleaseWatchWake(t *testing.T) {
	w := newReleaseWatch(5, 3)
	defer w.stop()
	for i := range 2 {
		w.notify(i, "0a", true)
	}
	select {
	case <-w.c:
		t.Fatal("woken by two of five nodes at once")
	default:
	}
	w.notify(2, "0a", true)
	select {
	case <-w.c:
	default:
		t.Fatal("no wake as the third of five nodes handed over the release")
	}
	w.notify(3, "0a", true)
	w.notify(4, "0a", true)
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

// A waiter not handed any release looks again after fallbackMin to twice
// that, then after twice as long; a hand-off brings it back to fallbackMin.
func TestReleaseWatchFallback(t *testing.T) {
	w := newReleaseWatch(1, 1)
	w.d = &driver{watching: map[string]map[*releaseWatch]struct{}{}, live: map[string]bool{}, gone: map[string]goneWait{}}
	w.quorum = 0 // no nodes: stop removes nothing
	defer w.stop()
	w.mu.Lock()
	w.armFallback()
	w.mu.Unlock()
	wake := func() time.Duration {
		t.Helper()
		start := time.Now()
		select {
		case <-w.c:
			return time.Since(start)
		case <-time.After(20 * fallbackMin):
			t.Fatal("no fallback wake")
			return 0
		}
	}
	if d := wake(); d < fallbackMin {
		t.Errorf("first fallback after %v; want at least %v", d, fallbackMin)
	}
	if d := wake(); d < 2*fallbackMin {
		t.Errorf("second fallback after %v; want at least %v", d, 2*fallbackMin)
	}
	w.notify(0, "", false) // a reconnection, as a hand-off, starts again
	<-w.c
	if d := wake(); d < fallbackMin || d > 2*fallbackMin+time.Second {
		t.Errorf("fallback after a wake came after %v; want %v to %v (+1s slack)", d, fallbackMin, 2*fallbackMin)
	}
}

// Hand-offs are recorded with their node's counter: the waiter is woken as
// the majority-th node hands it the lock, and not by fewer; once its
// records are no longer trusted (direct off), a majority of them wakes it
// only as any release does.
func TestReleaseWatchHanded(t *testing.T) {
	w := newReleaseWatch(5, 3)
	defer w.stop()
	w.notify(0, "0a:7", true)
	w.found(1, 8) // found handed by an attempt, its message still on the way
	select {
	case <-w.c:
		t.Fatal("woken by two of five hand-offs at once")
	default:
	}
	w.notify(1, "0a:8", true)
	w.notify(3, "0a:9", true)
	select {
	case <-w.c:
	default:
		t.Fatal("no wake as the third of five nodes handed over the lock")
	}
	w.mu.Lock()
	got := [5]uint64(w.fences)
	n, handed := w.nHanded, [5]bool(w.handed)
	w.mu.Unlock()
	if n != 3 || handed != [5]bool{true, true, false, true, false} || got != [5]uint64{7, 8, 0, 9, 0} {
		t.Errorf("recorded %d hand-offs %v with counters %v; want nodes 0, 1, 3 at 7, 8, 9", n, handed, got)
	}
	w.mu.Lock()
	w.direct = false
	w.mu.Unlock()
	w.notify(4, "0a:10", true)
	select {
	case <-w.c:
		t.Error("woken at once by a hand-off after the records were given up")
	default:
	}
}
