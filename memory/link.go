package memory

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLinkReset is what a request crossing a Link fails with when the link is
// reset, or healed after a partition swallowed it.
var ErrLinkReset = errors.New("memory: link reset")

// Link simulates the network path between one Locker and its Store, for
// fault tests: a request crossing it can be delayed, swallowed (partition) or
// failed (reset). The zero value is not usable; call NewLink.
type Link struct {
	mu      sync.Mutex
	latency time.Duration
	hole    chan struct{} // non-nil while partitioned; closed by Heal
	resets  chan struct{} // closed and replaced by Reset
}

// NewLink returns a perfect link.
func NewLink() *Link { return &Link{resets: make(chan struct{})} }

// Blackhole partitions the link: requests hang until their context ends;
// those still hanging when it is healed fail with ErrLinkReset.
func (l *Link) Blackhole() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hole == nil {
		l.hole = make(chan struct{})
	}
}

// Heal ends a partition.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hole != nil {
		close(l.hole)
		l.hole = nil
	}
}

// Reset fails every request in flight with ErrLinkReset.
func (l *Link) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.resets)
	l.resets = make(chan struct{})
}

// SetLatency delays every request by d (0: none).
func (l *Link) SetLatency(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latency = d
}

// Do sends the request op across the link and waits for its reply. A
// delayed request is in flight: it reaches the store (op runs) even if the
// caller gives up meanwhile, as a request in a real network would; the
// reply is delayed as much again. A partitioned request never arrives.
// Drivers of other kinds on a Store (package queue/memqueue) send their
// requests with it.
func (l *Link) Do(ctx context.Context, op func() error) error {
	l.mu.Lock()
	latency, hole, resets := l.latency, l.hole, l.resets
	l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if hole != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-hole:
			return ErrLinkReset
		case <-resets:
			return ErrLinkReset
		}
	}
	if latency <= 0 {
		return op()
	}
	reply := make(chan error, 1)
	time.AfterFunc(latency, func() {
		err := op()
		time.AfterFunc(latency, func() { reply <- err })
	})
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-resets:
		return ErrLinkReset
	case err := <-reply:
		return err
	}
}
