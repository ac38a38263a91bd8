package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

// lease is the driver's side of one held lock: the pooled connection whose
// session holds it, kept out of the pool until the lease ends.
type lease struct {
	d       *driver
	key     string
	connID  int64  // the session's connection id, as IS_USED_LOCK gives it
	fence   uint64 // the grant's fencing token, 0 without fencing
	held    string // held.sql on key
	release string // release.sql on key (on the driver's own pools, behind the SET putting wait_timeout back)

	mu     sync.Mutex // serialises the statements on c
	c      *sql.Conn  // nil once the lease ended
	secs   int64      // the session's wait_timeout
	lost   bool       // the session ended, or may have
	onLost func()
}

// newLease is the lease of a grant on c, whose session holds key's lock
// with wait_timeout secs.
func newLease(d *driver, c *sql.Conn, key string, connID int64, fence uint64, secs int64) *lease {
	l := &lease{d: d, c: c, key: key, connID: connID, fence: fence, secs: secs}
	l.held = fill(heldSQL, "$KEY", literal(key))
	l.release = fill(releaseSQL, "$KEY", literal(key))
	if d.multi {
		// The SET first: a failed SET fails the request before the
		// release, whose answer then is the request's last.
		l.release = batch(resetTimeoutSQL, l.release)
	}
	return l
}

// OnLost registers f, called when a statement of the lease finds its
// session gone (dlock/driver.LossNotifier).
func (l *lease) OnLost(f func()) {
	l.mu.Lock()
	if !l.lost {
		l.onLost = f
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f()
}

// Refresh moves the session's wait_timeout to ttl when it changes and
// checks that the session still holds the lock, in one request on the
// driver's own pools; running a statement at all restarts the server's
// idle count. A failed statement means the session ended or is ending
// (the client library closes a connection whose statement it gave up on):
// the lease is lost.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	secs, err := seconds(ttl)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return 0, fmt.Errorf("%w: mysql: the lease's session ended", dlock.ErrNotHeld)
	}
	check := l.held
	if secs != l.secs {
		timeout := fill(setTimeoutSQL, "$SECS", num(secs))
		if l.d.multi {
			check = batch(timeout, check)
		} else if _, err := l.c.ExecContext(ctx, timeout); err != nil {
			return 0, l.failed("refreshing", err)
		}
	}
	if err := l.check(ctx, check); err != nil {
		return 0, err
	}
	l.secs = secs
	if granted := time.Duration(secs) * time.Second; granted != ttl {
		return granted, nil
	}
	return 0, nil
}

// check asks the server whether the session holds the lock, with q:
// held.sql, perhaps behind a SET; l.mu is held.
func (l *lease) check(ctx context.Context, q string) error {
	var held sql.NullBool
	if err := l.c.QueryRowContext(ctx, q).Scan(&held); err != nil {
		return l.failed("checking", err)
	}
	if !alive(l.c) {
		return l.failed("checking", cause(ctx))
	}
	if !held.Valid || !held.Bool {
		// Another session can take the lock only after this one let go of
		// it, which it never does but on Release.
		l.endLocked(true)
		return fmt.Errorf("%w: mysql: the session no longer holds the lock", dlock.ErrNotHeld)
	}
	return nil
}

// Held asks the server whether the lease's session still holds the lock.
func (l *lease) Held(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return false, nil
	}
	if err := l.check(ctx, l.held); err != nil {
		if l.c == nil { // the session is gone: not held
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Release lets go of the lock and puts the connection back into the pool,
// with wait_timeout as the server's default: in one request on the
// driver's own pools.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return fmt.Errorf("%w: mysql: the lease's session ended", dlock.ErrNotHeld)
	}
	var released sql.NullInt64
	if err := l.c.QueryRowContext(ctx, l.release).Scan(&released); err != nil {
		return l.failed("releasing", err)
	}
	c := l.c
	l.forget()
	if released.Int64 != 1 {
		discard(c)
		return fmt.Errorf("%w: mysql: the session did not hold the lock", dlock.ErrNotHeld)
	}
	if l.d.multi {
		_ = c.Close() // the request put wait_timeout back
	} else {
		l.d.putBack(c)
	}
	return nil
}

// failed ends the lease after a failed statement: the client library has
// closed the connection (or the server had), so the session and its lock
// are gone, or go once the server sees the close. l.mu is held.
func (l *lease) failed(what string, err error) error {
	l.endLocked(true)
	return fmt.Errorf("%w: mysql: %s the lock, the session failed: %w", dlock.ErrNotHeld, what, err)
}

// end closes the lease's connection, ending its session and lock.
func (l *lease) end(lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(lost)
}

// endLocked is end with l.mu held.
func (l *lease) endLocked(lost bool) {
	if l.c == nil {
		return
	}
	c := l.c
	l.forget()
	discard(c)
	if lost && !l.lost {
		l.lost = true
		if f := l.onLost; f != nil {
			l.onLost = nil
			f()
		}
	}
}

// forget takes the lease out of the driver's books; l.mu is held.
func (l *lease) forget() {
	l.c = nil
	l.d.mu.Lock()
	delete(l.d.leases, l)
	l.d.mu.Unlock()
}
