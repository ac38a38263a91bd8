package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lease is the dlockdriver.Handle of one held lock: the pooled connection whose
// session holds it, kept out of the pool until a confirmed release.
//
// The Locker serialises Refresh, Held and Release. Besides them, three
// things touch the connection, under mu: the watcher (a goroutine reading
// the idle connection, so that the session's end is noticed at once), the
// driver's sweep (which starts the watcher once the connection has been idle
// for watchDelay, and gives the connection up once the lock has expired for
// sure; see driver.sweep), and the driver's Close.
type lease struct {
	d          *driver
	c          *pgxpool.Conn
	pg         *pgconn.PgConn
	name       string
	args       [3][]byte   // acquire.sql's parameters (here, not on the heap on their own)
	acquireRow             // pid is the backend that holds the lock
	onLost     func()      // called once the lease is given up (dlockdriver.LossNotifier); under mu
	relRow     releaseRow  // release.sql's result
	unlock     unlockCall  // fastUnlock's message
	cw         cancelWatch // of the statement running (see cancellable)
	kind       dlockdriver.Kind
	ks         *kindStmts // the statements of a kind other than KindLock (kinds.go)
	slot       int32      // a permit's slot
	relExtra   [][]byte   // a permit's release parameters after release's: slot, limit
	meta       bool       // the session recorded the lock's metadata (metadata.go)
	// place, when set, is the set of places the connection holds one of
	// (shared.go: the shared sessions' waiting connections, or the
	// connections of their own that locks take before they share
	// sessions), freed when the lease ends
	place atomic.Pointer[chan struct{}]
	// ms is the session's idle_session_timeout, in milliseconds, as the
	// acquisition or the last refresh set it; "" after held.sql set it to
	// the time left. The Locker serialises the statements that use it.
	ms string

	mu       sync.Mutex
	busy     bool          // a statement is running
	gone     bool          // the connection was given up or released
	lost     bool          // it was given up
	lastSent time.Time     // when the last statement that set the expiry was sent
	ttl      time.Duration // the idle_session_timeout set then
	idle     time.Time     // when the last statement ended (or the grant came)
	watching bool
	stopping bool          // the watcher is being stopped by us
	watched  chan struct{} // closed when the watcher has returned
}

// freePlace gives back the lease's place (see place), once.
func (h *lease) freePlace() {
	if p := h.place.Swap(nil); p != nil {
		<-*p
	}
}

// errGone is what the operations of a lease that gave its connection up
// return, wrapped with dlock.ErrNotHeld.
var errGone = errors.New("the lease's session has ended")

// begin claims the connection for a statement, stopping the watcher.
func (h *lease) begin() error {
	h.mu.Lock()
	if h.gone {
		h.mu.Unlock()
		return errGone
	}
	h.busy = true
	watched := h.stopWatch()
	h.mu.Unlock()
	if watched != nil {
		<-watched
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone { // the watcher saw the session end
		h.busy = false
		return errGone
	}
	return nil
}

// end releases the connection after a statement. A statement the server
// answered (ok) that set the expiry moves it.
func (h *lease) end(sent time.Time, ttl time.Duration, moved bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.busy = false
	if h.gone {
		return
	}
	if moved {
		h.lastSent, h.ttl = sent, ttl
	}
	h.idle = time.Now()
}

// stopWatch asks a running watcher to return, by a read deadline in the
// past; it returns the channel closed when it has, or nil. mu is held.
func (h *lease) stopWatch() chan struct{} {
	if !h.watching {
		return nil
	}
	if !h.stopping {
		h.stopping = true
		_ = h.pg.Conn().SetReadDeadline(time.Now())
	}
	return h.watched
}

// expiresAt is when the server has ended the lease's session for sure, if
// it heard nothing since the last statement; mu is held.
func (h *lease) expiresAt() time.Time { return h.lastSent.Add(h.ttl + expiryGrace) }

// sweep, called by the driver's sweep every watchDelay, starts the watcher
// on a connection idle for watchDelay, and gives the connection up once the
// lock has expired on the server for sure with no word of the session's end,
// unless a statement runs (which then decides).
func (h *lease) sweep(now time.Time) {
	h.mu.Lock()
	if h.busy || h.gone {
		h.mu.Unlock()
		return
	}
	if !now.Before(h.expiresAt()) {
		h.giveUpLocked()
		return
	}
	if !h.watching && now.Sub(h.idle) >= watchDelay {
		h.watching, h.stopping = true, false
		h.watched = make(chan struct{})
		h.d.wg.Add(1)
		go h.watch(h.watched)
	}
	h.mu.Unlock()
}

// watch reads the idle connection. The server sends nothing to an idle
// session unless it ends it (a FATAL error, then EOF) or a notification
// comes; a read deadline set by stopWatch ends the watch.
func (h *lease) watch(watched chan struct{}) {
	defer h.d.wg.Done()
	for {
		err := h.pg.WaitForNotification(context.Background())
		h.mu.Lock()
		if h.stopping {
			_ = h.pg.Conn().SetReadDeadline(time.Time{})
			h.watching = false
			h.mu.Unlock()
			close(watched)
			return
		}
		if err == nil {
			h.mu.Unlock()
			continue // a notification: someone else's business
		}
		// The server ended the session (FATAL, EOF). No statement runs: it
		// would have stopped the watch first.
		h.watching = false
		close(watched)
		h.giveUpLocked()
		return
	}
}

// OnLost implements dlockdriver.LossNotifier: f is called when the lease gives its
// connection up (see giveUp), at once if it has already.
func (h *lease) OnLost(f func()) {
	h.mu.Lock()
	if h.lost {
		h.mu.Unlock()
		f()
		return
	}
	h.onLost = f
	h.mu.Unlock()
}

// giveUp ends the lease as lost: it signals the loss, stops the watcher, and closes the connection (its session, and the lock, end)
// before handing it back to the pool, which drops it. It does nothing the
// second time, or after a release. The Locker reports the loss; the reason,
// where there is one, is in the error of the call that found it.
//
// Only the statement that holds the connection (busy), the driver's Close
// (when the Locker runs none), or, while none runs, the watcher and the
// sweep give a lease up.
func (h *lease) giveUp() {
	h.mu.Lock()
	h.giveUpLocked()
}

// giveUpLocked is giveUp with mu held; it unlocks mu.
func (h *lease) giveUpLocked() {
	if h.gone {
		h.mu.Unlock()
		return
	}
	h.gone, h.lost = true, true
	onLost := h.onLost
	watched := h.stopWatch()
	h.mu.Unlock()
	if onLost != nil {
		onLost()
	}
	if watched != nil {
		<-watched
	}
	discard(h.c)
	h.d.untrack(h)
}

// fail handles a statement's error: when it ended the connection (pgx closes
// it on network errors, on a FATAL error and when the driver's own context
// for the statement ends), the lease gives it up and no longer holds its
// lock. It reports whether it did. Other errors (a statement cancelled on
// request, an SQL error, a ctx that had ended before anything was sent)
// leave the session and its lock alone.
func (h *lease) fail(err error) bool {
	if h.pg.IsClosed() {
		h.giveUp()
		return true
	}
	return false
}

// opLimit bounds a statement whose ctx never ends: past the lock's expiry and
// a grace, its connection is given up.
func (h *lease) opLimit(ttl time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.ttl, ttl) + cancelGrace
}

func (h *lease) notHeld(op string, err error) error {
	return fmt.Errorf("%w: postgres: %s of %q: %w", dlock.ErrNotHeld, op, h.name, err)
}

// checkPID turns a statement that ran on another backend into loss.
func (h *lease) checkPID(op string, pid int32) error {
	if pid == h.pid {
		return nil
	}
	err := fmt.Errorf("%w: lease taken on backend %d, %s ran on backend %d", ErrPooler, h.pid, op, pid)
	h.giveUp()
	return h.notHeld(op, err)
}

// Refresh runs refresh.sql: the statement restarts the session's idle timer
// and sets it to ttl. ctx bounds it through the server (see cancellable), so
// that a ctx ending mid-statement does not close the connection.
func (h *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms, err := millis(ttl)
	if err != nil {
		return 0, err
	}
	if err := h.begin(); err != nil {
		return 0, h.notHeld("refresh", err)
	}
	var pid int32
	var idle *string
	sent := time.Now()
	_, err = h.cw.cancellable(ctx, h.pg, h.opLimit(ttl), func() error {
		return h.c.QueryRow(context.Background(), refreshSQL, h.pid, ms).Scan(&pid, &idle)
	})
	if err != nil {
		if h.fail(err) {
			return 0, h.notHeld("refresh", err)
		}
		h.end(sent, ttl, false)
		return 0, h.stmtError(ctx, "refresh", err)
	}
	if pid != h.pid {
		defer h.end(sent, ttl, false)
		return 0, h.checkPID("refresh", pid)
	}
	h.ms = ms
	h.end(sent, ttl, true)
	return ttl, nil
}

// Held runs held.sql: pg_locks for this session and key. It sets the
// session's idle timeout to the lease's time left, so that asking does not
// extend the lock on the server.
func (h *lease) Held(ctx context.Context) (bool, error) {
	if err := h.begin(); err != nil {
		return false, nil
	}
	h.mu.Lock()
	left := time.Until(h.lastSent.Add(h.ttl))
	h.mu.Unlock()
	ms, _ := millis(max(left, time.Millisecond))
	var pid int32
	var held *bool
	var idle *string
	h.ms = "" // whatever comes of it
	_, err := h.cw.cancellable(ctx, h.pg, h.opLimit(0), func() error {
		if h.ks != nil {
			return h.c.QueryRow(context.Background(), h.ks.held, h.heldArgs(ms)...).Scan(&pid, &held, &idle)
		}
		return h.c.QueryRow(context.Background(), heldSQL, h.pid, h.d.prefix+h.name, ms).Scan(&pid, &held, &idle)
	})
	if err != nil {
		if h.fail(err) {
			return false, nil
		}
		h.end(time.Time{}, 0, false)
		return false, h.stmtError(ctx, "check", err)
	}
	defer h.end(time.Time{}, 0, false)
	if err := h.checkPID("check", pid); err != nil {
		return false, err // the lease is lost; the error says why
	}
	if held == nil || !*held {
		h.giveUp() // the session no longer holds the lock
		return false, nil
	}
	return true, nil
}

// Release runs release.sql on the lease's session: pg_advisory_unlock, whose
// result says whether the session held the lock, and the session's settings
// restored. Only then does the connection go back to the pool, or, parked
// (see driver.park), with its settings left for the next acquisition and
// restored later. ctx is pgx's: when it ends mid-statement pgx closes the
// connection, which ends the session and frees the lock; the lease then
// reports loss.
func (h *lease) Release(ctx context.Context) error {
	if err := h.begin(); err != nil {
		return h.notHeld("release", err)
	}
	if h.ks != nil {
		return h.releaseKind(ctx)
	}
	r := &h.relRow
	park := h.ms != "" && h.ttl >= parkMinTTL && h.d.reserve()
	st := releaseStmt
	if park {
		st = releaseKept
	}
	var err error
	if park && h.d.checkPID {
		*r = releaseRow{}
		r.unlocked, err = fastUnlock(ctx, h.pg, &h.unlock, h.key)
	} else {
		err = st.run(ctx, h.c.Conn(), h.release[:], r)
	}
	if park && (err != nil || r.otherBackend || !r.unlocked) {
		h.d.unreserve()
	}
	if err != nil {
		if h.fail(err) {
			if ctx.Err() != nil {
				// Not ErrNotHeld: the caller learns that its release did not
				// complete; the lease reports loss, as the lock ends with the
				// session.
				return fmt.Errorf("postgres: release of %q cut short, connection closed (the lock ends with its session): %w", h.name, err)
			}
			return h.notHeld("release", err)
		}
		h.end(time.Time{}, 0, false)
		return h.stmtError(ctx, "release", err)
	}
	if r.otherBackend || !r.unlocked {
		defer h.end(time.Time{}, 0, false)
		h.giveUp()
		if r.otherBackend {
			return h.notHeld("release", fmt.Errorf("%w: lease taken on backend %d, release ran on another backend", ErrPooler, h.pid))
		}
		return h.notHeld("release", errors.New("the session did not hold the lock"))
	}
	h.mu.Lock()
	h.busy, h.gone = false, true
	h.mu.Unlock()
	if h.meta && h.dropMetadata(ctx) != nil {
		// Released, but the session may still have the row: it must not
		// hold another lease.
		if park {
			h.d.unreserve()
		}
		discard(h.c)
		h.d.untrack(h)
		return nil
	}
	if park {
		h.d.park(parked{c: h.c, ms: h.ms, orig: [2][]byte{h.release[2], h.release[3]}, at: time.Now()}, h)
		return nil
	}
	h.c.Release()
	h.d.untrack(h)
	return nil
}

// releaseRow is release.sql's result.
type releaseRow struct {
	unlocked     bool
	otherBackend bool // unlocked was NULL
}

func (r *releaseRow) decode(v [][]byte) (err error) {
	if r.otherBackend = v[0] == nil; r.otherBackend {
		return nil
	}
	r.unlocked, err = decodeBool(v[0])
	return err
}

// stmtError describes a statement that failed without ending the session
// (cancelled, or an SQL error): the lease holds on.
func (h *lease) stmtError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("postgres: %s of %q: %w (%w)", op, h.name, ctx.Err(), err)
	}
	return fmt.Errorf("postgres: %s of %q: %w", op, h.name, err)
}
