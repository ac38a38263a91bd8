package backoff

import (
	"context"
	"testing"
	"time"
)

// Next doubles from Min to Max, each delay within [step, step×1.25], and
// Reset starts from Min again.
func TestNext(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	steps := []time.Duration{10, 20, 40, 80, 100, 100}
	for round := range 2 {
		for i, s := range steps {
			s *= time.Millisecond
			if got := b.Next(); got < s || got > s+s/4 {
				t.Fatalf("round %d, delay %d: got %v, want %v..%v", round, i, got, s, s+s/4)
			}
		}
		b.Reset()
	}
}

// Min = Max gives that delay, jittered, every time.
func TestFixed(t *testing.T) {
	b := Backoff{Min: time.Second, Max: time.Second}
	for range 5 {
		if got := b.Next(); got < time.Second || got > time.Second+time.Second/4 {
			t.Fatalf("got %v, want 1s..1.25s", got)
		}
	}
}

// Jitter stays within [d, d×1.25], and is not constant.
func TestJitter(t *testing.T) {
	if got := Jitter(0); got != 0 {
		t.Fatalf("Jitter(0) = %v, want 0", got)
	}
	if got := Jitter(-time.Second); got != 0 {
		t.Fatalf("Jitter(-1s) = %v, want 0", got)
	}
	d := 100 * time.Millisecond
	seen := map[time.Duration]bool{}
	for range 100 {
		got := Jitter(d)
		if got < d || got > d+d/4 {
			t.Fatalf("Jitter(%v) = %v, want %v..%v", d, got, d, d+d/4)
		}
		seen[got] = true
	}
	if len(seen) < 2 {
		t.Fatalf("Jitter(%v) gave %d distinct values in 100, want randomness", d, len(seen))
	}
}

// Sleep waits for the delay, and returns false at once when ctx has ended.
func TestSleep(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: time.Millisecond}
	start := time.Now()
	if !b.Sleep(context.Background()) {
		t.Fatal("Sleep with a live ctx returned false")
	}
	if d := time.Since(start); d < time.Millisecond {
		t.Fatalf("Sleep returned after %v, want ≥ 1ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b = Backoff{Min: time.Hour, Max: time.Hour}
	if b.Sleep(ctx) {
		t.Fatal("Sleep with an ended ctx returned true")
	}
}
