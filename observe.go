package dlock

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Observer is how a Locker tells what happens to its leases: to a logger,
// to a hook (metrics, traces: see the OpenTelemetry adapter in
// github.com/dlock/dlock/otel), or both. The zero Observer is silent, which
// is the default. Set it with Locker.SetObserver.
type Observer struct {
	// Logger receives, with the lock name and never a token or password:
	// losses (Error), refresh failures the watchdog will retry (Warn),
	// acquisitions that failed for another reason than the lock being held
	// or the ctx ending (Warn), slow acquisitions (Info, see SlowAcquire),
	// and acquisitions, releases and retried attempts (Debug).
	Logger *slog.Logger
	// SlowAcquire, when positive, logs at Info every acquisition that took
	// at least this long.
	SlowAcquire time.Duration
	// Hook is called for every Event, synchronously, on the goroutine where
	// it happens: Acquire's or Release's caller, or the lease's watchdog
	// task (each runs on a goroutine of its own, so a slow hook delays that
	// lease's next refresh, not other leases'). It must not block for long
	// and must not call the Locker or the lease.
	Hook func(Event)
}

// SetObserver sets the Locker's Observer; the zero Observer turns it off.
// It may be called at any time, also while leases are held.
func (l *Locker) SetObserver(o Observer) {
	if o.Logger == nil && o.Hook == nil {
		l.obs.Store(nil)
		return
	}
	l.obs.Store(&o)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventAcquired: a lease was granted. Duration is the call's (the wait).
	EventAcquired EventKind = iota + 1
	// EventAcquireFailed: Acquire or TryAcquire returned Err (ErrInvalid
	// excepted). Duration is the call's.
	EventAcquireFailed
	// EventReleased: the lease was released. Duration is the Release call's,
	// Held how long the lease was held.
	EventReleased
	// EventRefreshFailed: a watchdog refresh failed with Err; the lease
	// stays valid until ValidUntil and the watchdog tries again.
	EventRefreshFailed
	// EventLost: the lease was lost; Err is the reason (matching ErrLost),
	// Held how long it was held.
	EventLost
)

var eventNames = [...]string{"", "acquired", "acquire_failed", "released", "refresh_failed", "lost"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && k > 0 {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing that happened to a lease or an acquisition.
type Event struct {
	Kind EventKind
	// Context is the caller's for acquisitions and releases (for tracing),
	// the lease's (Lease.Context, possibly ended) for the watchdog's events.
	Context  context.Context
	Name     string
	Duration time.Duration
	Held     time.Duration
	// Fence is the lease's fencing token, when it has one.
	Fence      uint64
	ValidUntil time.Time // the lease's, where there is a lease
	Err        error
}

// emit hands ev to the hook and the logger.
func (o *Observer) emit(ev Event) {
	if o.Hook != nil {
		o.Hook(ev)
	}
	if o.Logger == nil {
		return
	}
	ctx := ev.Context
	if ctx == nil {
		ctx = context.Background()
	}
	level, msg := slog.LevelDebug, ""
	attrs := []slog.Attr{slog.String("lock", ev.Name)}
	switch ev.Kind {
	case EventAcquired:
		msg = "dlock: acquired"
		if o.SlowAcquire > 0 && ev.Duration >= o.SlowAcquire {
			level, msg = slog.LevelInfo, "dlock: slow acquisition"
		}
		attrs = append(attrs, slog.Duration("wait", ev.Duration))
	case EventAcquireFailed:
		msg = "dlock: acquisition failed"
		if !errors.Is(ev.Err, ErrNotAcquired) && !errors.Is(ev.Err, context.Canceled) && !errors.Is(ev.Err, context.DeadlineExceeded) {
			level = slog.LevelWarn
		}
		attrs = append(attrs, slog.Duration("wait", ev.Duration), slog.Any("error", ev.Err))
	case EventReleased:
		msg = "dlock: released"
		attrs = append(attrs, slog.Duration("held", ev.Held))
	case EventRefreshFailed:
		level, msg = slog.LevelWarn, "dlock: refresh failed; retrying until the lease's validity ends"
		attrs = append(attrs, slog.Duration("valid_for", time.Until(ev.ValidUntil).Round(time.Millisecond)), slog.Any("error", ev.Err))
	case EventLost:
		level, msg = slog.LevelError, "dlock: lease lost"
		attrs = append(attrs, slog.Duration("held", ev.Held), slog.Any("reason", ev.Err))
	}
	o.Logger.LogAttrs(ctx, level, msg, attrs...)
}

// logRetry logs at Debug an attempt of a wait that failed with a backend
// error and will be retried after delay.
func (l *Locker) logRetry(ctx context.Context, name string, err error, delay time.Duration) {
	if o := l.obs.Load(); o != nil && o.Logger != nil {
		o.Logger.LogAttrs(ctx, slog.LevelDebug, "dlock: attempt failed; retrying",
			slog.String("lock", name), slog.Duration("after", delay), slog.Any("error", err))
	}
}
