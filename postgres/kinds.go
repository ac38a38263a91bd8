package postgres

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Read/write locks and semaphores: each kind has advisory keys of its own,
// hashed from the same key text (KeyPrefix || name) with another seed, so
// that a lock, a read/write lock and a semaphore of one name are three
// objects (see the package doc, Layout):
//
//	lock             hashtextextended(text, 0)              (acquire.sql)
//	read/write lock  hashtextextended(text, 1)              shared for readers
//	semaphore queue  hashtextextended(text, 2)              (permit_queue.sql)
//	permit slot i    int4 pair of hashtextextended(text, 3) (permit.sql)
//	limit N          int4 pair of hashtextextended(text, 4) (permit.sql)

var (
	//go:embed permit.sql
	permitFile string
	//go:embed permit_queue.sql
	permitQueueFile string
	//go:embed permit_release.sql
	permitReleaseFile string

	permitSQL        = statement("permit.sql", permitFile)
	permitQueueSQL   = statement("permit_queue.sql", permitQueueFile)
	permitReleaseSQL = statement("permit_release.sql", permitReleaseFile)
)

// The keys' SQL: the key of an acquisition ($1 is the key text), the unlock
// of a release and the pg_locks match of held.sql ($2 is the key text).
const (
	lockKey    = "hashtextextended($1, 0)"
	lockUnlock = "pg_advisory_unlock(hashtextextended($2, 0))"
	lockMatch  = `objsubid = 1
           AND classid = ((hashtextextended($2, 0) >> 32) & 4294967295)::oid
           AND objid = (hashtextextended($2, 0) & 4294967295)::oid`

	rwKey   = "hashtextextended($1, 1)"
	rwMatch = `objsubid = 1
           AND classid = ((hashtextextended($2, 1) >> 32) & 4294967295)::oid
           AND objid = (hashtextextended($2, 1) & 4294967295)::oid`

	// permitMatch: slot $4 of the semaphore, a pair of int4 keys.
	permitMatch = `objsubid = 2
           AND classid = ((hashtextextended($2, 3) >> 32) & 4294967295)::oid
           AND objid = ((((hashtextextended($2, 3) >> 16) & 65535) << 16) | $4::int8)::oid`
)

// heldStatement is held.sql with match, the pg_locks conditions of the
// lease's key.
func heldStatement(match string) string {
	return strings.ReplaceAll(statement("held.sql", heldFile), "{{match}}", match)
}

// kindStmts are the statements of a kind other than KindLock.
type kindStmts struct {
	wait, try *stmt  // acquire.sql (read/write) or permit.sql
	release   *stmt  // release.sql (read/write) or permit_release.sql
	held      string // held.sql
}

// newKindStmts makes the statements of the kinds, fence being the fencing
// expression (writers and permits fence; readers never do).
func newKindStmts(fence string) [dlockdriver.KindWrite + 1]*kindStmts {
	// A read/write lock's {{take}} clauses are the lock's on the
	// read/write key, with the _shared functions for a reader.
	rw := func(take, fn, fence string) string {
		take = strings.ReplaceAll(take, "pg_advisory_lock(hashtextextended($1, 0))", fn+"(hashtextextended($1, 1))")
		take = strings.ReplaceAll(take, "pg_try_advisory_lock(hashtextextended($1, 0))", strings.Replace(fn, "pg_", "pg_try_", 1)+"(hashtextextended($1, 1))")
		return strings.ReplaceAll(take, "{{fence}}", fence)
	}
	side := func(fn, unlock, fence string) *kindStmts {
		return &kindStmts{
			wait:    newAcquireStmt(acquireStatement(rwKey, rw(waitTake, fn, fence), prevSettings, fence)),
			try:     newAcquireStmt(acquireStatement(rwKey, rw(tryTake, fn, fence), prevSettings, fence)),
			release: newReleaseStmtOf(unlock, restore),
			held:    heldStatement(rwMatch),
		}
	}
	permit := func(unqueue string) *stmt {
		sql := strings.ReplaceAll(permitSQL, "{{unqueue}}", unqueue)
		return newStmt(strings.ReplaceAll(sql, "{{fence}}", fence),
			[]uint32{oidText, oidInt4, oidText, oidInt4},
			[]uint32{oidInt4, oidText, oidText, oidInt8, oidFloat8, oidInt4})
	}
	var k [dlockdriver.KindWrite + 1]*kindStmts
	k[dlockdriver.KindRead] = side("pg_advisory_lock_shared", "pg_advisory_unlock_shared(hashtextextended($2, 1))", "0::int8")
	k[dlockdriver.KindWrite] = side("pg_advisory_lock", "pg_advisory_unlock(hashtextextended($2, 1))", fence)
	k[dlockdriver.KindPermit] = &kindStmts{
		wait: permit("WHEN pg_advisory_unlock(hashtextextended($1, 2)) IS NULL THEN NULL"),
		try:  permit(""),
		release: newStmt(permitReleaseSQL,
			[]uint32{oidInt4, oidText, oidText, oidText, oidInt4, oidInt4}, []uint32{oidBool}),
		held: heldStatement(permitMatch),
	}
	return k
}

// permitRow is permit.sql's result, decoded into the lease's acquireRow.
type permitRow struct {
	*acquireRow
	slot *int32 // NULL: the pid did not match
}

func (r permitRow) decode(v [][]byte) (err error) {
	if r.pid, err = decodeInt4(v[0]); err != nil {
		return err
	}
	if r.pidCheck = v[3] != nil; r.pidCheck {
		if r.fence, err = decodeInt8(v[3]); err != nil {
			return err
		}
	}
	if r.waited, err = decodeFloat8(v[4]); err != nil {
		return err
	}
	if v[5] == nil {
		*r.slot = 0
		r.pidCheck = false
	} else if *r.slot, err = decodeInt4(v[5]); err != nil {
		return err
	}
	// release.sql's parameters but the key text, which the caller sets.
	buf := make([]byte, 0, len(v[0])+len(v[1])+len(v[2]))
	buf = append(buf, v[0]...)
	n := len(buf)
	buf = append(buf, v[1]...)
	m := len(buf)
	buf = append(buf, v[2]...)
	r.release[0], r.release[2], r.release[3] = buf[:n:n], buf[n:m:m], buf[m:]
	return nil
}

// permitRetryMax bounds how long the head of a semaphore's queue waits
// between two looks when it hears no release: the slots of holders whose
// session ended (expiry, crash, a reset) come back without a notification.
const permitRetryMax = time.Second

// acquirePermit makes one attempt at a permit (permit.sql), or, for a
// waiting Acquire, waits for one: first in the server's FIFO queue of the
// semaphore's queue key (permit_queue.sql), so that waiters are served in
// the order they came; then, at the head of the queue, it listens for
// releases (permit_release.sql notifies) and looks again at each, or after
// a backoff (10ms doubling up to a quarter of the TTL, within 1s) for the
// slots that sessions' ends free silently. Its connection is closed when the
// wait ends without a permit, which ends its place in the queue, its
// listening and anything a cut-short statement took.
func (d *driver) acquirePermit(ctx context.Context, req dlockdriver.Request, ms string, wait bool, ks *kindStmts) (*dlockdriver.Grant, error) {
	c, err := d.conn(ctx)
	if err != nil {
		return nil, err
	}
	pg := c.Conn().PgConn()
	var pid int32
	if d.checkPID {
		pid = int32(pg.PID())
	}
	h := &lease{d: d, c: c, pg: pg, name: req.Name, ttl: req.TTL, ms: ms, kind: req.Kind, ks: ks}
	keyText := d.prefix + req.Name
	var limit [4]byte
	binary.BigEndian.PutUint32(limit[:], uint32(req.Limit))
	args := [][]byte{[]byte(keyText), binary.BigEndian.AppendUint32(nil, uint32(pid)), []byte(ms), limit[:]}
	row := permitRow{acquireRow: &h.acquireRow, slot: &h.slot}
	// fail ends an attempt without a permit; the connection is closed unless
	// keep (nothing of the attempt is left on its session).
	fail := func(keep bool, err error) (*dlockdriver.Grant, error) {
		if keep {
			c.Release()
		} else {
			discard(c)
		}
		if ctx.Err() != nil && !errors.Is(err, dlock.ErrNotAcquired) {
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
		return nil, err
	}
	stmtError := func(err error) error {
		if pg.IsClosed() {
			err = &connError{err}
		}
		return fmt.Errorf("postgres: acquiring a permit of %q: %w", req.Name, err)
	}
	st := ks.try
	var channel, prevIdle string
	if wait {
		st = ks.wait
		var ch *string
		cancelled, err := h.cw.cancellableEnding(ctx, pg, func() error {
			return c.QueryRow(context.Background(), permitQueueSQL, keyText, ms).Scan(&prevIdle, &ch)
		})
		switch {
		case err == nil && cancelled:
			return fail(false, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err()))
		case err != nil:
			return fail(false, stmtError(err))
		case ch == nil:
			return fail(false, stmtError(errNoRow))
		}
		channel = quoteChannel(*ch)
		if _, err := pg.Exec(ctx, "LISTEN "+channel).ReadAll(); err != nil {
			return fail(false, stmtError(err))
		}
	}
	// The head's backoff grows no longer than a quarter of the TTL.
	retry := backoff.Backoff{Min: retryMin, Max: max(retryMin, min(req.TTL/4, permitRetryMax))}
	for {
		sent := time.Now()
		var notified bool
		if wait {
			// The head's look must not lose a release's notification that
			// comes with its answer (see runListening).
			notified, err = st.runListening(ctx, pg, args, row)
		} else {
			err = st.run(ctx, c.Conn(), args, row)
		}
		recv := time.Now()
		if err != nil {
			return fail(false, stmtError(err))
		}
		switch {
		case !h.pidCheck && h.slot < -1:
			return fail(!wait, dlockdriver.LimitMismatch(req.Name, req.Limit, int(-h.slot-1)))
		case !h.pidCheck:
			return fail(false, fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, pg.PID(), h.pid))
		case h.fence >= 0:
			if wait { // the setting before permit_queue.sql's
				h.release[2] = []byte(prevIdle)
			}
			return d.grantPermit(ctx, h, req, keyText, channel, sent, recv)
		case !wait:
			return fail(true, dlockdriver.Busy(0))
		}
		if notified {
			continue // a release during the look: look again
		}
		// The head of the queue: wait for a release, or the backoff. A
		// read deadline ends the wait (a timeout leaves the connection
		// usable); ctx's end sets it to now.
		delay := retry.Next()
		conn := pg.Conn()
		_ = conn.SetReadDeadline(time.Now().Add(delay))
		stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
		err = pg.WaitForNotification(context.Background())
		stop()
		switch {
		case ctx.Err() != nil:
			return fail(false, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err()))
		case err != nil && !pgconn.Timeout(err):
			return fail(false, stmtError(err))
		}
		_ = conn.SetReadDeadline(time.Time{})
	}
}

// quoteChannel quotes a channel name made of letters, digits and _.
func quoteChannel(s string) string { return `"` + s + `"` }

// runListening runs s on pg, as an unnamed statement (Parse, Bind, Execute,
// Sync, in one round trip), reading the protocol's messages itself so that
// it sees a notification that comes with the answer: the server delivers
// one that arrived while the statement ran just before its ReadyForQuery,
// which pgconn would hand to the connection's OnNotification alone (the
// application's, when the pool is). notified reports one. An exchange cut
// short (ctx ended, a network error) closes the connection, as fastUnlock's.
func (s *stmt) runListening(ctx context.Context, pg *pgconn.PgConn, params [][]byte, row rowDecoder) (notified bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	synced := false
	var stop func() bool
	var fired chan struct{}
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = pg.Conn().SetDeadline(time.Now())
			close(fired)
		})
	}
	defer func() {
		if stop != nil && !stop() {
			<-fired
			if err != nil {
				err = errors.Join(ctx.Err(), err)
			}
			if synced {
				_ = pg.Conn().SetDeadline(time.Time{})
			}
		}
		if !synced && !pg.IsClosed() {
			cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			_ = pg.Close(cctx)
			cancel()
		}
	}()
	fe := pg.Frontend()
	fe.Send(&pgproto3.Parse{Query: s.sql, ParameterOIDs: s.params})
	fe.Send(&pgproto3.Bind{ParameterFormatCodes: s.paramFmts, Parameters: params, ResultFormatCodes: s.resultFmts})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		return false, err
	}
	got := false
	var serr error // the server's error, or the row's
	for {
		msg, err := pg.ReceiveMessage(context.Background()) // see ctx above
		if err != nil {
			return notified, errors.Join(serr, err)
		}
		switch m := msg.(type) {
		case *pgproto3.NotificationResponse:
			notified = true
		case *pgproto3.DataRow:
			if !got && len(m.Values) == len(s.results) {
				got = true
				serr = row.decode(m.Values)
			}
		case *pgproto3.ErrorResponse:
			serr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			synced = true
			switch {
			case serr != nil:
				return notified, serr
			case !got:
				return notified, errNoRow
			}
			return notified, nil
		}
	}
}

// grantPermit finishes a permit's acquisition: a waiting head stops
// listening (one more statement, the permit held), and the lease is
// tracked.
func (d *driver) grantPermit(ctx context.Context, h *lease, req dlockdriver.Request, keyText, channel string, sent, recv time.Time) (*dlockdriver.Grant, error) {
	if channel != "" {
		if _, err := h.pg.Exec(ctx, "UNLISTEN "+channel).ReadAll(); err != nil {
			discard(h.c)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
			}
			return nil, fmt.Errorf("postgres: acquiring a permit of %q: %w", req.Name, err)
		}
	}
	var fence uint64
	if d.fencing {
		if h.fence <= 0 {
			discard(h.c)
			return nil, fmt.Errorf("postgres: acquiring a permit of %q: no fencing token", req.Name)
		}
		fence = uint64(h.fence)
	}
	h.release[1] = []byte(keyText)
	h.relExtra = [][]byte{binary.BigEndian.AppendUint32(nil, uint32(h.slot)), binary.BigEndian.AppendUint32(nil, uint32(req.Limit))}
	h.lastSent, h.idle = sent, recv
	if !d.track(h) {
		h.giveUp()
		return nil, dlock.ErrClosed
	}
	return &dlockdriver.Grant{Handle: h, Fence: fence, Sent: sent}, nil
}

// releaseKind is Release for a kind other than KindLock: its release
// statement, restoring the session's settings; the connection then goes
// back to the pool (never parked).
func (h *lease) releaseKind(ctx context.Context) error {
	r := &h.relRow
	params := h.release[:]
	if h.relExtra != nil {
		params = append(params[:len(params):len(params)], h.relExtra...)
	}
	err := h.ks.release.run(ctx, h.c.Conn(), params, r)
	if err != nil {
		if h.fail(err) {
			if ctx.Err() != nil {
				return fmt.Errorf("postgres: release of %q cut short, connection closed (the %s ends with its session): %w", h.name, h.kind, err)
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
		return h.notHeld("release", fmt.Errorf("the session did not hold the %s", h.kind))
	}
	h.mu.Lock()
	h.busy, h.gone = false, true
	h.mu.Unlock()
	h.c.Release()
	h.d.untrack(h)
	return nil
}

// heldArgs are held.sql's arguments: a permit's also name its slot.
func (h *lease) heldArgs(ms string) []any {
	if h.kind == dlockdriver.KindPermit {
		return []any{h.pid, h.d.prefix + h.name, ms, h.slot}
	}
	return []any{h.pid, h.d.prefix + h.name, ms}
}
