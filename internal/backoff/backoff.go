// Package backoff is dlock's one delay between retries: it doubles from a
// minimum to a maximum, and each delay is made up to a quarter longer at
// random, so that clients that failed together do not retry together.
//
// It is internal: the Locker does the retrying of TryAcquire for every
// driver, and the drivers in this module use it for their own waits
// (reconnects, server-side queues). A third-party driver needs none; if
// one does, it can be made public later without breaking anything.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff gives the delays between the retries of one loop. Its zero value
// with Min and Max set is ready; Min > 0 and Max ≥ Min.
type Backoff struct {
	Min, Max time.Duration
	step     time.Duration // the next delay before jitter; zero: Min
}

// Next returns the next delay, the current step plus up to a quarter of it,
// and doubles the step, up to Max.
func (b *Backoff) Next() time.Duration {
	d := b.step
	if d == 0 {
		d = b.Min
	}
	b.step = min(2*d, b.Max)
	return Jitter(d)
}

// Reset starts again from Min, after a success.
func (b *Backoff) Reset() { b.step = 0 }

// Sleep waits for the next delay; it returns false, at once, if ctx ends
// first.
func (b *Backoff) Sleep(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Jitter returns d plus a random duration of at most d/4 (zero for d ≤ 0).
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d + rand.N(d/4+1)
}
