package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// cancellable runs q, a statement on pg, with a context that never ends
// (so pgx neither watches it nor closes the connection for it), while ctx
// bounds it through the server: when ctx ends first, cancel requests ask the
// server to stop the statement, which then fails with query_canceled and
// leaves the session (and any lock it holds) alone. Only when the statement
// still runs cancelGrace later (the server is unreachable), or after limit
// (when not zero), does the connection get a deadline in the past: the
// statement fails and pgx closes the connection. cancellable waits for its
// cancel requests to finish; it reports whether it sent any. w is the
// lease's: its statements run one at a time.
func (w *cancelWatch) cancellable(ctx context.Context, pg *pgconn.PgConn, limit time.Duration, q func() error) (cancelled bool, err error) {
	return w.run(ctx, pg, limit, false, q)
}

// cancellableEnding is cancellable for a statement whose session ends
// (discard) whenever a cancel was sent: no later statement runs there for a
// late request to cancel, so the request under way when the statement
// returns is abandoned rather than waited for. On a loaded machine the
// server closes a cancel request's connection long after the statement
// ended (100-400ms at load 30 on 2 cores), and a cancelled wait returned
// only then.
func (w *cancelWatch) cancellableEnding(ctx context.Context, pg *pgconn.PgConn, q func() error) (cancelled bool, err error) {
	return w.run(ctx, pg, 0, true, q)
}

func (w *cancelWatch) run(ctx context.Context, pg *pgconn.PgConn, limit time.Duration, ends bool, q func() error) (cancelled bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	conn := pg.Conn()
	if limit > 0 {
		_ = conn.SetDeadline(time.Now().Add(limit))
	}
	gaveUp := false
	if ctx.Done() == nil {
		err = q()
	} else {
		if w.fire == nil {
			w.fire = w.watch
		}
		w.ctx, w.pg, w.ends = ctx, pg, ends
		w.wg.Add(1)
		stop := context.AfterFunc(ctx, w.fire)
		err = q()
		if stop() {
			w.wg.Done() // w.watch will not run
		} else {
			w.mu.Lock()
			w.finished = true
			if w.done != nil {
				close(w.done)
				if w.ends {
					w.abort()
				}
			}
			w.mu.Unlock()
			w.wg.Wait()
		}
		cancelled, gaveUp = w.cancelled, w.gaveUp
		*w = cancelWatch{fire: w.fire}
	}
	if (limit != 0 || gaveUp) && !pg.IsClosed() {
		_ = conn.SetDeadline(time.Time{})
	}
	return cancelled, err
}

// cancelWatch is the state of one cancellable statement, in the lease (no
// allocation per statement but the AfterFunc's own).
type cancelWatch struct {
	fire      func() // watch, bound once
	ctx       context.Context
	pg        *pgconn.PgConn
	wg        sync.WaitGroup // watch, when it runs
	mu        sync.Mutex
	finished  bool          // the statement returned
	done      chan struct{} // made by watch, closed when the statement returns
	cancelled bool          // watch sent cancel requests
	gaveUp    bool          // watch set a deadline in the past
	ends      bool          // cancellableEnding
	abort     func()        // ends watch's requests (with done)
}

// watch runs when the statement's ctx ends first: it sends cancel requests
// until the statement returns, or gives the connection up cancelGrace
// (cancelGraceEnding) later.
func (w *cancelWatch) watch() {
	defer w.wg.Done()
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	// A request under way is let finish even once the statement returned,
	// so that none reaches the server later and cancels the next statement
	// (unless no statement follows: cancellableEnding).
	grace := cancelGrace
	if w.ends {
		grace = cancelGraceEnding
	}
	gctx, gcancel := context.WithTimeout(context.WithoutCancel(w.ctx), grace)
	defer gcancel()
	w.cancelled = true
	w.done = make(chan struct{})
	w.abort = gcancel
	done := w.done
	w.mu.Unlock()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-gctx.Done():
			select {
			case <-done: // abandoned by cancellableEnding
				return
			default:
			}
			// The server did not answer: give the connection up.
			_ = w.pg.Conn().SetDeadline(time.Now())
			w.gaveUp = true // reset by cancellable if the statement succeeded nonetheless
			return
		case <-t.C:
			_ = w.pg.CancelRequest(gctx)
			t.Reset(cancelRetry)
		}
	}
}
