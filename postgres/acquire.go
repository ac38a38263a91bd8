package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// deadConnRetries is how many times TryAcquire replaces a pooled connection
// that turns out dead.
const deadConnRetries = 3

// TryAcquire makes one pg_try_advisory_lock attempt (acquire.sql, one round
// trip). A pooled connection that turns out dead (the server restarted since
// the pool last used it) is replaced, up to deadConnRetries times: its
// session is gone, and with it anything the statement might have taken.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	ms, err := millis(req.TTL)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		g, err := d.acquire(ctx, req, ms, false)
		err = lockTableFull(err)
		if err == nil || i == deadConnRetries || ctx.Err() != nil || !isConnError(err) {
			return g, err
		}
	}
}

// Acquire waits in the server's lock queue (pg_advisory_lock). When its
// connection fails (a restart, a dropped connection) it queues again on
// another after a backoff, until ctx ends.
func (d *driver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	ms, err := millis(req.TTL)
	if err != nil {
		return nil, err
	}
	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	var timer *time.Timer
	for {
		g, err := d.acquire(ctx, req, ms, true)
		err = lockTableFull(err)
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return g, err
		}
		delay := retry.Next()
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w (after: %w)", dlock.ErrNotAcquired, ctx.Err(), err)
		case <-timer.C:
		}
	}
}

// acquire makes one attempt: on a shared session (shared.go), or on a
// connection of its own (acquireConn). By default (d.own set) a lock that
// may share a session takes a connection of its own while one of d.own's
// places is free, and shares a session past them.
func (d *driver) acquire(ctx context.Context, req dlockdriver.Request, ms string, wait bool) (*dlockdriver.Grant, error) {
	if d.shared == nil || req.Kind != dlockdriver.KindLock || (req.Metadata != "" && d.meta != nil) {
		return d.acquireConn(ctx, req, ms, wait)
	}
	if d.own == nil { // Options.SharedSessions
		return d.shared.acquire(ctx, req, ms, wait)
	}
	if req.TTL < SharedMinTTL {
		return d.acquireConn(ctx, req, ms, wait)
	}
	select {
	case d.own <- struct{}{}:
	default:
		return d.shared.acquire(ctx, req, ms, wait)
	}
	g, err := d.acquireConn(ctx, req, ms, wait)
	if g == nil {
		<-d.own
		return g, err
	}
	g.Handle.(*lease).place.Store(&d.own)
	return g, err
}

// acquireConn makes one attempt on a connection from the pool: one
// pg_try_advisory_lock, or one wait in pg_advisory_lock.
func (d *driver) acquireConn(ctx context.Context, req dlockdriver.Request, ms string, wait bool) (*dlockdriver.Grant, error) {
	// A lock may take a parked connection; the other kinds take theirs from
	// the pool (kinds.go).
	var ks *kindStmts
	var kept parked
	ok := false
	if req.Kind == dlockdriver.KindLock {
		kept, ok = d.unpark()
	} else if ks = d.kinds[req.Kind]; req.Kind == dlockdriver.KindPermit {
		return d.acquirePermit(ctx, req, ms, wait, ks)
	}
	c := kept.c
	if !ok {
		var err error
		if c, err = d.conn(ctx); err != nil {
			return nil, err
		}
	} else if err := d.ensureEpochOf(ctx, c); err != nil {
		return nil, err
	}
	pg := c.Conn().PgConn()
	var pid int32
	if d.checkPID {
		pid = int32(pg.PID())
	}
	// The lease is made first: the row is decoded into it.
	h := &lease{d: d, c: c, pg: pg, name: req.Name, ttl: req.TTL, ms: ms, kind: req.Kind, ks: ks}
	waitStmt, tryStmt := d.waitStmt, d.tryStmt
	if ks != nil {
		waitStmt, tryStmt = ks.wait, ks.try
	} else if ok && kept.ms == ms {
		waitStmt, tryStmt = d.waitKept, d.tryKept
	}
	r := &h.acquireRow
	buf := make([]byte, 0, len(d.prefix)+len(req.Name)+4+len(ms))
	buf = append(append(buf, d.prefix...), req.Name...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(pid))
	buf = append(buf, ms...)
	n := len(d.prefix) + len(req.Name)
	h.args = [3][]byte{buf[:n:n], buf[n : n+4 : n+4], buf[n+4:]}
	r.release[1] = h.args[0]
	sent := time.Now()
	var err error
	if wait {
		var cancelled bool
		cancelled, err = h.cw.cancellableEnding(ctx, pg, func() error {
			return waitStmt.run(context.Background(), c.Conn(), h.args[:], r)
		})
		if err == nil && cancelled {
			// Granted as the wait was cancelled: closing the session gives
			// the lock back.
			discard(c)
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
	} else {
		err = tryStmt.run(ctx, c.Conn(), h.args[:], r)
	}
	recv := time.Now()
	if err != nil {
		// The statement may have taken the lock before it failed (a
		// cancel, a broken connection): the session must end.
		if pg.IsClosed() {
			err = &connError{err}
		}
		discard(c)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
		return nil, fmt.Errorf("postgres: acquiring %q: %w", req.Name, err)
	}
	switch {
	case !r.pidCheck:
		discard(c)
		return nil, fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, pg.PID(), r.pid)
	case r.fence < 0: // nothing changed on the session
		if ok {
			d.repark(kept)
		} else {
			c.Release()
		}
		return nil, dlockdriver.Busy(0)
	}
	if ok {
		r.release[2], r.release[3] = kept.orig[0], kept.orig[1]
	}
	var fence uint64
	if d.fencing && req.Kind != dlockdriver.KindRead {
		if r.fence <= 0 {
			discard(c)
			return nil, fmt.Errorf("postgres: acquiring %q: no fencing token", req.Name)
		}
		fence = uint64(r.fence)
	}
	if wait {
		// The TTL runs from the grant, which the server timed: sent plus the
		// time the statement waited, which cannot exceed what the client saw.
		w := time.Duration(r.waited * float64(time.Second))
		sent = sent.Add(max(0, min(w, recv.Sub(sent))))
	}
	if req.Metadata != "" && d.meta != nil && req.Kind == dlockdriver.KindLock {
		if err := d.storeMetadata(ctx, h, fence, req.Metadata); err != nil {
			discard(c)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
			}
			return nil, fmt.Errorf("postgres: acquiring %q: storing its metadata: %w", req.Name, err)
		}
		h.meta = true
	}
	h.lastSent, h.idle = sent, recv
	if !d.track(h) {
		h.giveUp()
		return nil, dlock.ErrClosed
	}
	// Loss is reported through OnLost (dlockdriver.LossNotifier) alone.
	return &dlockdriver.Grant{Handle: h, Fence: fence, Sent: sent}, nil
}

// poolWait is how long an acquisition waits for a connection once the pool
// has none free (every connection is out) before it fails with
// dlock.ErrResourceLimit; poolPoll is how often a wait for a connection
// looks whether the pool is full.
const (
	poolWait = time.Second
	poolPoll = poolWait / 10
)

// errPoolFull ends a wait for a connection of a full pool.
var errPoolFull = errors.New("postgres: the pool is full")

// conn takes a connection from the pool for an acquisition, its fencing
// epoch checked.
//
// Every lease and wait holds a connection of its own: when the pool has
// none free, the acquisition waits only as long as another user's short
// request takes, then says which limit is reached rather than wait on.
// Whether the pool is full is looked at while the wait goes on, not only
// before it: callers racing to fill the pool all pass a look taken before
// the pool filled, and the last of them would wait for a release, for as
// long as their ctx lets them.
func (d *driver) conn(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &poolWatch{d: d, cancel: cancel}
	w.mu.Lock()
	w.t = time.AfterFunc(w.next(time.Now()), w.check)
	w.mu.Unlock()
	c, err := d.pool.Acquire(actx)
	w.stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
		if errors.Is(context.Cause(actx), errPoolFull) {
			holders, more := "each lease and each wait holds one", ", or let locks share sessions (remove shared_sessions=false, or set shared_sessions=true)"
			if d.shared != nil {
				holders, more = "each shared session, each wait, and each permit, read/write lock or lease with metadata holds one", ""
				if d.own != nil {
					holders = "locks take one each up to half of them, then share a few; " + holders
				}
			}
			return nil, fmt.Errorf("%w: postgres: all %d connections of the pool are in use (%s): raise pool_max_conns, within the server's max_connections%s",
				dlock.ErrResourceLimit, d.pool.Config().MaxConns, holders, more)
		}
		return nil, fmt.Errorf("postgres: getting a connection: %w", err)
	}
	if err := d.ensureEpochOf(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// poolWatch bounds one wait for a connection: it looks at the pool every
// poolPoll, and ends the wait poolWait after it first found the pool full.
type poolWatch struct {
	d      *driver
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer
	full   time.Time // when the pool was first seen full; zero until then
	done   bool      // the wait ended
}

// next looks at the pool and returns how long to wait before the next
// look; 0 when the wait has gone on poolWait since the pool was full. w.mu
// is held.
func (w *poolWatch) next(now time.Time) time.Duration {
	if w.full.IsZero() {
		if st := w.d.pool.Stat(); st.AcquiredConns() < st.MaxConns() {
			return poolPoll
		}
		w.full = now
	}
	return max(0, poolWait-now.Sub(w.full))
}

func (w *poolWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	if next := w.next(time.Now()); next > 0 {
		w.t.Reset(next)
		return
	}
	w.done = true
	w.cancel(errPoolFull)
}

func (w *poolWatch) stop() {
	w.mu.Lock()
	w.done = true
	w.t.Stop()
	w.mu.Unlock()
}

// ensureEpochOf is ensureEpoch for an acquisition, when fencing is on: on
// failure the connection is discarded.
func (d *driver) ensureEpochOf(ctx context.Context, c *pgxpool.Conn) error {
	if !d.fencing {
		return nil
	}
	err := d.ensureEpoch(ctx, c.Conn())
	if err == nil {
		return nil
	}
	if c.Conn().PgConn().IsClosed() {
		err = &connError{err}
	}
	discard(c)
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
	}
	return err
}

// track registers a lease holding a connection, starting the sweep if it is
// not running; false once the driver is closed.
func (d *driver) track(h *lease) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.leases[h] = struct{}{}
	d.startSweep()
	return true
}

// connError marks the failure of a statement whose connection ended: its
// session is gone, and with it anything the statement may have done.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

func isConnError(err error) bool {
	var ce *connError
	return errors.As(err, &ce)
}

// lockTableFull turns the server's "out of shared memory" (SQLSTATE 53200:
// its lock table, of max_locks_per_transaction × (max_connections +
// max_prepared_transactions) entries for every session's locks, is full),
// which thousands of leases on shared sessions can meet, into
// dlock.ErrResourceLimit: the acquisition fails at once, not retried, as
// when the pool is full.
func lockTableFull(err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Code != "53200" || errors.Is(err, dlock.ErrResourceLimit) {
		return err
	}
	return fmt.Errorf("%w: postgres: the server's lock table is full (max_locks_per_transaction × (max_connections + max_prepared_transactions) locks, shared by every session): raise max_locks_per_transaction on the server, or hold fewer leases: %w",
		dlock.ErrResourceLimit, err)
}

// retryable reports an error after which a wait starts again: a connection
// that ended or could not be made (a server restarting), a server starting up
// or shutting down, too many connections, a statement cancelled by someone
// else or by statement_timeout. Authentication and configuration errors are
// not.
func retryable(err error) bool {
	if errors.Is(err, dlock.ErrResourceLimit) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code[:min(2, len(pe.Code))] {
		case "08", "53", "57":
			return true
		}
		return false
	}
	var ce *connError
	var cfe *pgconn.ConnectError
	return errors.As(err, &ce) || errors.As(err, &cfe)
}
