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
)

// setUp connects sess and sets its session up; on failure sess is gone.
func (sess *session) setUp(ctx context.Context, ttl time.Duration, ms string) {
	defer close(sess.ready)
	c, err := sess.set.d.conn(ctx)
	if err == nil {
		var pid int32
		var set bool
		err = c.Conn().QueryRow(ctx, sharedSetUpSQL, ms).Scan(&pid, &sess.orig[0], &sess.orig[1], &set)
		switch {
		case err != nil:
			discard(c)
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
			}
		case sess.set.d.checkPID && pid != int32(c.Conn().PgConn().PID()):
			discard(c)
			err = fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, c.Conn().PgConn().PID(), pid)
		}
		if err == nil {
			sess.c, sess.pg, sess.pid = c, c.Conn().PgConn(), pid
			check := pid
			if !sess.set.d.checkPID {
				check = 0
			}
			sess.pidB = binary.BigEndian.AppendUint32(nil, uint32(check))
			now := time.Now()
			sess.ttl, sess.lastSent, sess.idle = ttl, now, now
		}
	}
	if err != nil {
		sess.mu.Lock()
		sess.gone, sess.err = true, err
		sess.mu.Unlock()
		sess.set.mu.Lock()
		sess.set.removeLocked(sess)
		delete(sess.set.all, sess)
		sess.set.mu.Unlock()
	}
}

// sharedSetUpSQL sets a shared session up: its settings before, then
// idle_session_timeout at $1 ms and synchronous_commit off, as acquire.sql.
const sharedSetUpSQL = `/* dlock: shared session */ SELECT pg_backend_pid(), current_setting('idle_session_timeout'), current_setting('synchronous_commit'),
  set_config('idle_session_timeout', $1, false) IS NOT NULL AND set_config('synchronous_commit', 'off', false) IS NOT NULL`

// The statements of leases on a shared session, each checking that it runs
// on the session's backend ($1).
const (
	sharedRefreshSQL = `/* dlock: shared refresh */ SELECT pg_backend_pid(), CASE WHEN pg_backend_pid() = $1 THEN set_config('idle_session_timeout', $2, false) END`
	sharedUnlockSQL  = `/* dlock: shared release */ SELECT CASE WHEN pg_backend_pid() = $1 THEN pg_advisory_unlock(hashtextextended($2, 0)) END`
)

// wait waits until sess is set up; an error once it is gone.
func (sess *session) wait(ctx context.Context) error {
	select {
	case <-sess.ready:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.gone {
		if sess.err != nil {
			return sess.err
		}
		return &connError{errSessionGone}
	}
	return nil
}

// call runs op on sess's connection, one statement at a time. ctx bounds
// the wait for the connection and for op's answer, but not op itself: when
// ctx ends first, op goes on in the background (bounded by the statement
// deadline, see exec) and abandon, if not nil, runs once it is done; call
// returns ctx's error, and abandoned true (false: op never ran). Giving up
// the statement itself would end the session, and every lease on it.
func (sess *session) call(ctx context.Context, op func(), abandon func()) (abandoned bool, err error) {
	select {
	case sess.run <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if ctx.Done() == nil {
		sess.exec(op)
		<-sess.run
		return false, nil
	}
	var mu sync.Mutex
	finished, gaveUp := false, false // under mu
	done := make(chan struct{})
	sess.set.d.wg.Add(1)
	go func() {
		defer sess.set.d.wg.Done()
		sess.exec(op)
		<-sess.run
		mu.Lock()
		finished = true
		ab := gaveUp
		mu.Unlock()
		close(done)
		if ab && abandon != nil {
			abandon()
		}
	}()
	select {
	case <-done:
		return false, nil
	case <-ctx.Done():
		mu.Lock()
		if finished {
			mu.Unlock()
			<-done
			return false, nil
		}
		gaveUp = true
		mu.Unlock()
		return true, ctx.Err()
	}
}

// exec runs op with the watcher stopped and a deadline on the connection
// (past which pgx closes it: the server is gone or stuck). The run slot is
// held.
func (sess *session) exec(op func()) {
	sess.mu.Lock()
	if sess.gone {
		sess.mu.Unlock()
		op() // op finds the session gone
		return
	}
	sess.busy = true
	watched := sess.stopWatch()
	limit := max(sess.ttl, time.Second) + cancelGrace
	sess.mu.Unlock()
	if watched != nil {
		<-watched
	}
	_ = sess.pg.Conn().SetDeadline(time.Now().Add(limit))
	op()
	if !sess.pg.IsClosed() {
		_ = sess.pg.Conn().SetDeadline(time.Time{})
	}
	sess.mu.Lock()
	sess.busy = false
	sess.idle = time.Now()
	sess.mu.Unlock()
}

// isGone reports whether the session has ended.
func (sess *session) isGone() bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.gone
}

// failed handles a statement's error: a closed connection ends the session
// and loses its leases. It reports whether it did.
func (sess *session) failed(err error) bool {
	if sess.pg.IsClosed() {
		sess.lose(&connError{err})
		return true
	}
	return false
}

// try makes one pg_try_advisory_lock attempt of key on sess.
// abandoned reports an attempt whose ctx ended while its statement ran:
// the statement's end gives back what it took.
func (sess *session) try(ctx context.Context, req dlockdriver.Request, key, ms string) (g *dlockdriver.Grant, abandoned bool, _ error) {
	if err := sess.wait(ctx); err != nil {
		return nil, false, err
	}
	d := sess.set.d
	h := &sharedLease{s: sess, key: key, name: req.Name, ttl: req.TTL}
	var r acquireRow
	var sent time.Time
	var err error
	var granted bool
	op := func() {
		if sess.isGone() {
			err = &connError{errSessionGone}
			return
		}
		sess.mu.Lock()
		raise := req.TTL > sess.ttl
		sess.mu.Unlock()
		sent = time.Now()
		if raise {
			var pid int32
			var idle *string
			if err = sess.c.Conn().QueryRow(context.Background(), sharedRefreshSQL, sess.pid, ms).Scan(&pid, &idle); err != nil {
				if !sess.failed(err) {
					sess.lose(&connError{err})
				}
				return
			}
		}
		err = d.tryKept.run(context.Background(), sess.c.Conn(), [][]byte{[]byte(key), sess.pidB, []byte(ms)}, &r)
		if err != nil {
			if !sess.failed(err) {
				// The lock may have been taken before the statement failed.
				sess.unlockOrLose(key)
			}
			return
		}
		if !r.pidCheck {
			err = fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, sess.pid, r.pid)
			sess.lose(err)
			return
		}
		sess.mu.Lock()
		defer sess.mu.Unlock()
		sess.lastSent = sent
		if raise {
			sess.ttl = req.TTL
		}
		if r.fence < 0 || sess.gone {
			return
		}
		granted = true
		h.lastSent, h.keyB = sent, r.key
		sess.noteExpiryLocked(sent.Add(req.TTL))
		sess.leases[h] = struct{}{}
		sess.ttls[req.TTL]++
	}
	abandon := func() {
		if granted {
			_ = h.Release(context.Background())
		} else {
			sess.set.unreserve(key)
			sess.set.done(sess)
		}
	}
	if ab, cerr := sess.call(ctx, op, abandon); cerr != nil {
		return nil, ab, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, cerr)
	}
	if err != nil {
		if isConnError(err) || errors.Is(err, dlock.ErrNotAcquired) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("postgres: acquiring %q: %w", req.Name, err)
	}
	if !granted {
		return nil, false, nil // busy
	}
	var fence uint64
	if d.fencing {
		if r.fence <= 0 {
			_ = h.Release(context.Background()) // cleans up
			return nil, true, fmt.Errorf("postgres: acquiring %q: no fencing token", req.Name)
		}
		fence = uint64(r.fence)
	}
	// The TTL runs from when the Locker called (Sent zero): before any wait
	// for the session or its set-up.
	return &dlockdriver.Grant{Handle: h, Fence: fence}, false, nil
}

// unlockOrLose unlocks key on sess after a failed statement may have taken
// it (the name is reserved: no lease of it is on sess); if that fails too,
// the session ends. The run slot is held.
func (sess *session) unlockOrLose(key string) {
	var ok *bool
	err := sess.c.Conn().QueryRow(context.Background(), sharedUnlockSQL, sess.pid, key).Scan(&ok)
	if err != nil {
		sess.lose(&connError{err})
	}
}

// lose ends the session: every lease on it is lost, each reporting it, and
// the connection is closed. Idempotent.
func (sess *session) lose(why error) {
	sess.mu.Lock()
	if sess.gone {
		sess.mu.Unlock()
		return
	}
	sess.loseLocked(why)
}

// loseLocked is lose with sess.mu held; it unlocks it.
func (sess *session) loseLocked(why error) {
	sess.gone, sess.err = true, why
	var lost []*sharedLease
	var calls []func()
	for h := range sess.leases {
		h.gone, h.lost = true, true
		if h.onLost != nil {
			calls = append(calls, h.onLost)
		}
		lost = append(lost, h)
	}
	clear(sess.leases)
	watched := sess.stopWatch()
	sess.mu.Unlock()
	for _, f := range calls {
		f()
	}
	if watched != nil {
		<-watched
	}
	if sess.c != nil {
		discard(sess.c)
	}
	set := sess.set
	set.mu.Lock()
	set.removeLocked(sess)
	delete(set.all, sess)
	for _, h := range lost {
		delete(set.held, h.key)
	}
	sess.users -= len(lost)
	set.mu.Unlock()
}

// retire gives an unused session back to the pool, its settings restored.
func (sess *session) retire() {
	<-sess.ready
	sess.run <- struct{}{}
	defer func() { <-sess.run }()
	sess.mu.Lock()
	if sess.gone {
		sess.mu.Unlock()
		sess.set.forget(sess)
		return
	}
	sess.gone = true
	watched := sess.stopWatch()
	sess.mu.Unlock()
	if watched != nil {
		<-watched
	}
	sess.set.forget(sess)
	unparkTo(parked{c: sess.c, orig: [2][]byte{[]byte(sess.orig[0]), []byte(sess.orig[1])}})
}

func (s *sharedSet) forget(sess *session) {
	s.mu.Lock()
	delete(s.all, sess)
	s.mu.Unlock()
}

// stopWatch asks a running watcher to return; sess.mu is held.
func (sess *session) stopWatch() chan struct{} {
	if !sess.watching {
		return nil
	}
	if !sess.stopping {
		sess.stopping = true
		_ = sess.pg.Conn().SetReadDeadline(time.Now())
	}
	return sess.watched
}

// watch reads the idle connection, as lease.watch does: the server sends
// an idle session nothing unless it ends it.
func (sess *session) watch(watched chan struct{}) {
	defer sess.set.d.wg.Done()
	for {
		err := sess.pg.WaitForNotification(context.Background())
		sess.mu.Lock()
		if sess.stopping {
			_ = sess.pg.Conn().SetReadDeadline(time.Time{})
			sess.watching = false
			sess.mu.Unlock()
			close(watched)
			return
		}
		if err == nil {
			sess.mu.Unlock()
			continue
		}
		sess.watching = false
		close(watched)
		sess.loseLocked(&connError{err})
		return
	}
}
