package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
)

// Steal takes the named lock over at once, whoever holds it (or nobody),
// and returns the new lease, whose fence is above the previous holder's.
// It is for breaking a stuck lock (the `dlock steal` command), not for
// taking turns: the previous holder goes on working until it hears, and
// only the fence keeps its late writes out of the resource.
//
// The previous holder's lease ends with an error matching ErrLost (and
// ErrTakenOver where the driver can tell): as soon as the backend tells it
// on a driver whose Capabilities declare StealNotified, else at its next
// refresh, within its refresh interval (TTL/3 by default). Waiters keep
// their places, behind the new holder. A driver that cannot take a lock
// over (Capabilities.Steal false) fails with an error matching
// errors.ErrUnsupported, before any I/O.
func (l *Locker) Steal(ctx context.Context, name string, opts *Options) (*Lease, error) {
	if _, ok := l.d.(driver.Stealer); !ok || !l.caps.Steal {
		return nil, fmt.Errorf("dlock: taking %q over: %w by this driver", name, errors.ErrUnsupported)
	}
	return l.acquire(ctx, object{name: name, steal: true}, opts, false)
}

// stealAttempt is attempt for a steal: one Stealer.Steal, abandoned when it
// fails after its request may have been sent, and its grant's validity
// checked.
func (l *Locker) stealAttempt(ctx context.Context, req driver.Request) (*driver.Grant, time.Time, error) {
	sent := time.Now()
	g, err := l.d.(driver.Stealer).Steal(ctx, req)
	if err != nil {
		if l.abandoner != nil && !errors.Is(err, ErrInvalid) {
			l.abandon(ctx, req)
		}
		return nil, sent, err
	}
	sent, err = l.checkValidity(ctx, req, g, sent)
	return g, sent, err
}
