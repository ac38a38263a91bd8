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
)

//go:embed acquire_all.sql
var acquireAllFile string

// acquireAllStatement is acquire_all.sql with fence, the fencing
// expression, in place.
func acquireAllStatement(fence string) string {
	return strings.ReplaceAll(statement("acquire_all.sql", acquireAllFile), "{{fence}}", fence)
}

// The fence column of acquire_all.sql, when not a token.
const (
	allBusy     = -1 // the first key held by someone else
	allGaveBack = -2 // taken and given back
	allNotHeld  = -3 // given back, but the session did not hold it
)

// TryAcquireAll implements dlockdriver.MultiAcquirer: every name in one
// statement (acquire_all.sql) on one shared session, all or none. The
// statement try-locks the names in their sorted order and, at the first one
// held elsewhere, unlocks those it took before it answers, so a partial
// grant is never visible past it; when all were free it takes their fencing
// tokens. The leases are leases on a shared session, as the one-name
// TryAcquire's past half the pool: an AcquireAll's lease is lost as a whole
// anyway, so its names sharing one session's fate costs nothing, and it
// holds one connection instead of one per name.
//
// Without shared sessions (Options.NoSharedSessions), or with a TTL under
// SharedMinTTL, the Locker takes the names one by one (errors.ErrUnsupported).
func (d sharedDriver) TryAcquireAll(ctx context.Context, reqs []dlockdriver.Request) ([]*dlockdriver.Grant, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	ttl := reqs[0].TTL
	for _, req := range reqs {
		if req.Kind != dlockdriver.KindLock || req.Metadata != "" || req.TTL != ttl {
			return nil, fmt.Errorf("postgres: one statement for several names: %w for these requests", errors.ErrUnsupported)
		}
	}
	if ttl < SharedMinTTL {
		return nil, fmt.Errorf("postgres: one statement for several names needs a shared session, whose TTL is %v at least: %w for a TTL of %v", SharedMinTTL, errors.ErrUnsupported, ttl)
	}
	ms, err := millis(ttl)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		gs, err := d.shared.tryAll(ctx, reqs, ms)
		err = lockTableFull(err)
		if err == nil || i == deadConnRetries || ctx.Err() != nil || !isConnError(err) {
			return gs, err
		}
	}
}

var _ dlockdriver.MultiAcquirer = sharedDriver{}

// tryAll takes every one of reqs on one shared session of their TTL, or
// none. A name that the Locker holds, or is taking, on a shared session is
// busy, as for acquire.
func (s *sharedSet) tryAll(ctx context.Context, reqs []dlockdriver.Request, ms string) ([]*dlockdriver.Grant, error) {
	keys := make([]string, len(reqs))
	for i, req := range reqs {
		keys[i] = s.d.prefix + req.Name
	}
	s.mu.Lock()
	for _, key := range keys {
		if _, busy := s.held[key]; busy {
			s.mu.Unlock()
			return nil, dlockdriver.Busy(0)
		}
	}
	for _, key := range keys {
		s.held[key] = struct{}{}
	}
	sess, created := s.pickLocked(ms)
	sess.users += len(keys) - 1 // a use per lease: each lease's end is one done
	s.mu.Unlock()
	if created {
		sess.setUp(ctx, reqs[0].TTL, ms)
	}
	gs, abandoned, err := sess.tryAll(ctx, reqs, keys, ms)
	if gs != nil || abandoned {
		return gs, err // an abandoned attempt cleans up after itself
	}
	s.giveUpAll(sess, keys)
	if err != nil {
		return nil, err
	}
	return nil, dlockdriver.Busy(0)
}

// giveUpAll ends the reservation of keys on sess, none of which it holds.
func (s *sharedSet) giveUpAll(sess *session, keys []string) {
	s.mu.Lock()
	for _, key := range keys {
		delete(s.held, key)
	}
	if sess.users -= len(keys); sess.users == 0 {
		sess.empty = time.Now()
	}
	s.mu.Unlock()
}

// allRow is one row of acquire_all.sql.
type allRow struct {
	pid   int32
	fence *int64
	key   int64
}

// tryAll runs acquire_all.sql for keys on sess. gs is nil when the names
// were not all free (err nil: one was busy); abandoned reports an attempt
// whose ctx ended while its statement ran, which gives back what it took
// once it is over (see call).
func (sess *session) tryAll(ctx context.Context, reqs []dlockdriver.Request, keys []string, ms string) (gs []*dlockdriver.Grant, abandoned bool, _ error) {
	if err := sess.wait(ctx); err != nil {
		return nil, false, err
	}
	d := sess.set.d
	ttl := reqs[0].TTL
	hs := make([]*sharedLease, len(reqs))
	for i, req := range reqs {
		hs[i] = &sharedLease{s: sess, key: keys[i], name: req.Name, ttl: ttl}
	}
	rows := make([]allRow, 0, len(keys))
	var err error
	var granted bool
	op := func() {
		if sess.isGone() {
			err = &connError{errSessionGone}
			return
		}
		sess.mu.Lock()
		raise := ttl > sess.ttl
		sess.mu.Unlock()
		sent := time.Now()
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
		check := int32(0)
		if d.checkPID {
			check = sess.pid
		}
		rows, err = queryAll(sess, d.acquireAll, check, keys, rows)
		if err == nil && len(rows) != len(keys) {
			err = fmt.Errorf("%d rows for %d names", len(rows), len(keys))
		}
		if err != nil {
			if !sess.failed(err) {
				// Some locks may have been taken before it failed.
				sess.unlockAllOrLose(keys)
			}
			return
		}
		if d.checkPID && rows[0].pid != sess.pid {
			err = fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, sess.pid, rows[0].pid)
			sess.lose(err)
			return
		}
		all := true
		for _, r := range rows {
			switch {
			case r.fence == nil || *r.fence == allBusy || *r.fence == allGaveBack:
				all = false
			case *r.fence == allNotHeld:
				err = errors.New("the session did not hold a lock it had just taken")
				sess.lose(err)
				return
			}
		}
		sess.mu.Lock()
		defer sess.mu.Unlock()
		sess.lastSent = sent
		if raise {
			sess.ttl = ttl
		}
		if !all || sess.gone {
			return
		}
		granted = true
		for i, h := range hs {
			h.lastSent, h.keyB = sent, binary.BigEndian.AppendUint64(nil, uint64(rows[i].key))
			sess.leases[h] = struct{}{}
		}
		sess.ttls[ttl] += len(hs)
		sess.noteExpiryLocked(sent.Add(ttl))
	}
	abandon := func() {
		if granted {
			releaseAll(hs)
		} else {
			sess.set.giveUpAll(sess, keys)
		}
	}
	if ab, cerr := sess.call(ctx, op, abandon); cerr != nil {
		return nil, ab, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, cerr)
	}
	if err != nil {
		if isConnError(err) || errors.Is(err, dlock.ErrNotAcquired) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("postgres: acquiring %d names: %w", len(keys), err)
	}
	if !granted {
		return nil, false, nil // busy
	}
	gs = make([]*dlockdriver.Grant, len(hs))
	for i, h := range hs {
		var fence uint64
		if d.fencing {
			if *rows[i].fence <= 0 {
				releaseAll(hs) // cleans up
				return nil, true, fmt.Errorf("postgres: acquiring %q: no fencing token", h.name)
			}
			fence = uint64(*rows[i].fence)
		}
		// The TTL runs from when the Locker called (Sent zero), as for
		// a lease on a shared session taken alone.
		gs[i] = &dlockdriver.Grant{Handle: h, Fence: fence}
	}
	return gs, false, nil
}

// queryAll runs acquire_all.sql on sess's connection and appends its rows
// to rows. The run slot is held.
func queryAll(sess *session, sql string, check int32, keys []string, rows []allRow) ([]allRow, error) {
	rs, err := sess.c.Conn().Query(context.Background(), sql, check, keys)
	if err != nil {
		return rows, err
	}
	defer rs.Close()
	for rs.Next() {
		var r allRow
		if err := rs.Scan(&r.pid, &r.fence, &r.key); err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// unlockAllOrLose unlocks keys on sess after a failed statement may have
// taken some of them (they are reserved: no lease of them is on sess); if
// that fails too, the session ends. The run slot is held.
func (sess *session) unlockAllOrLose(keys []string) {
	rs, err := sess.c.Conn().Query(context.Background(), sharedReleaseSQL, sess.pid, keys)
	if err == nil {
		for rs.Next() {
		}
		rs.Close()
		err = rs.Err()
	}
	if err != nil {
		sess.lose(&connError{err})
	}
}

// releaseAll releases the leases of one TryAcquireAll that is given up, at
// once, so that their releases go in one statement.
func releaseAll(hs []*sharedLease) {
	done := make(chan struct{}, len(hs))
	for _, h := range hs {
		go func() {
			_ = h.Release(context.Background())
			done <- struct{}{}
		}()
	}
	for range hs {
		<-done
	}
}
