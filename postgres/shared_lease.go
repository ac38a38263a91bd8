package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	"github.com/jackc/pgx/v5"
)

func (s *sharedSet) startSweepLocked() {
	if !s.sweeping {
		s.sweeping = true
		s.d.wg.Add(1)
		go s.sweep()
	}
}

// sweep runs while there are shared sessions: every watchDelay/2 it starts
// the watcher of idle sessions, gives up a session whose expiry on the
// server has passed with no word from it (a partition), and unlocks the
// leases left unrefreshed past their TTL.
func (s *sharedSet) sweep() {
	defer s.d.wg.Done()
	t := time.NewTicker(watchDelay / 2)
	defer t.Stop()
	var list []*session
	for {
		select {
		case <-s.d.closing:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if len(s.all) == 0 {
			s.sweeping = false
			s.mu.Unlock()
			return
		}
		list = list[:0]
		for x := range s.all {
			list = append(list, x)
		}
		s.mu.Unlock()
		now := time.Now()
		for _, x := range list {
			x.sweep(now)
		}
		clear(list)
	}
}

func (sess *session) sweep(now time.Time) {
	select {
	case <-sess.ready:
	default:
		return
	}
	sess.mu.Lock()
	if sess.gone || sess.busy {
		sess.mu.Unlock()
		return
	}
	if !now.Before(sess.lastSent.Add(sess.ttl + expiryGrace)) {
		sess.loseLocked(errors.New("the shared session expired with no word from the server"))
		return
	}
	if len(sess.leases) == 0 && len(sess.run) == 0 {
		ttl := sess.ttl
		sess.mu.Unlock()
		sess.set.retireIdle(sess, now, ttl)
		return
	}
	var expired []*sharedLease
	if !sess.nextExpiry.IsZero() && !now.Before(sess.nextExpiry) {
		// One may have expired: look at each, and note the earliest
		// expiry of the others. Leases the watchdog refreshes make this
		// one pass every two thirds of a TTL or so, not every round.
		sess.nextExpiry = time.Time{}
		for h := range sess.leases {
			at := h.lastSent.Add(h.ttl)
			if !now.Before(at) {
				expired = append(expired, h)
			} else {
				sess.noteExpiryLocked(at)
			}
		}
	}
	if !sess.watching && now.Sub(sess.idle) >= watchDelay {
		sess.watching, sess.stopping = true, false
		sess.watched = make(chan struct{})
		sess.set.d.wg.Add(1)
		go sess.watch(sess.watched)
	}
	sess.mu.Unlock()
	if len(expired) > 0 {
		sess.set.d.wg.Add(1)
		go func() {
			defer sess.set.d.wg.Done()
			for _, h := range expired {
				h.expire()
			}
		}()
	}
}

// noteExpiryLocked makes sure the sweep looks at the leases by at; sess.mu
// is held.
func (sess *session) noteExpiryLocked(at time.Time) {
	if sess.nextExpiry.IsZero() || at.Before(sess.nextExpiry) {
		sess.nextExpiry = at
	}
}

// expire unlocks a lease left unrefreshed past its TTL, as the server would
// have ended its own session, and reports it lost.
func (h *sharedLease) expire() {
	sess := h.s
	_, _ = sess.call(context.Background(), func() {
		sess.mu.Lock()
		if h.gone {
			sess.mu.Unlock()
			return
		}
		if at := h.lastSent.Add(h.ttl); time.Now().Before(at) {
			sess.noteExpiryLocked(at) // refreshed since the sweep looked
			sess.mu.Unlock()
			return
		}
		onLost := h.forgetLocked(true)
		sess.mu.Unlock()
		if onLost != nil {
			onLost()
		}
		sess.unlockOrLose(h.key)
		sess.set.unreserve(h.key)
		sess.set.done(sess)
	}, nil)
}

// forgetLocked takes h off its session; sess.mu is held. It returns the
// loss callback to call when lost.
func (h *sharedLease) forgetLocked(lost bool) func() {
	sess := h.s
	h.gone, h.lost = true, lost
	delete(sess.leases, h)
	if sess.ttls[h.ttl]--; sess.ttls[h.ttl] <= 0 {
		delete(sess.ttls, h.ttl)
	}
	if lost {
		return h.onLost
	}
	return nil
}

// maxTTLLocked is the longest TTL of the session's leases, and at least
// ttl; sess.mu is held.
func (sess *session) maxTTLLocked(ttl time.Duration) time.Duration {
	for t := range sess.ttls {
		ttl = max(ttl, t)
	}
	return ttl
}

// OnLost implements dlockdriver.LossNotifier.
func (h *sharedLease) OnLost(f func()) {
	h.s.mu.Lock()
	if h.lost {
		h.s.mu.Unlock()
		f()
		return
	}
	h.onLost = f
	h.s.mu.Unlock()
}

func (h *sharedLease) notHeld(op string, err error) error {
	return fmt.Errorf("%w: postgres: %s of %q: %w", dlock.ErrNotHeld, op, h.name, err)
}

// Refresh runs one statement on the lease's session, which restarts its
// idle timer (for every lease on it) and sets idle_session_timeout to the
// longest TTL of its leases.
func (h *sharedLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	if _, err := millis(ttl); err != nil {
		return 0, err
	}
	errs := h.s.refresh(ctx, []*sharedLease{h}, []time.Duration{ttl})
	return 0, errs[0]
}

// refresh refreshes hs, leases of sess, to ttls in one statement, with
// the refreshes of other batches queued for the session meanwhile.
func (sess *session) refresh(ctx context.Context, hs []*sharedLease, ttls []time.Duration) []error {
	req := &refreshReq{hs: hs, ttls: ttls, errs: make([]error, len(hs))}
	sess.mu.Lock()
	sess.refreshes = append(sess.refreshes, req)
	sess.mu.Unlock()
	ab, err := sess.call(ctx, sess.refreshPending, nil)
	if err == nil {
		return req.errs
	}
	if !ab {
		sess.mu.Lock()
		for i, r := range sess.refreshes {
			if r == req { // not sent
				sess.refreshes = append(sess.refreshes[:i], sess.refreshes[i+1:]...)
				break
			}
		}
		sess.mu.Unlock()
	}
	errs := make([]error, len(hs)) // a statement under way may still write req's
	for i, h := range hs {
		errs[i] = fmt.Errorf("postgres: refresh of %q: %w", h.name, err)
	}
	return errs
}

// refreshReq is a batch of refreshes waiting for its session's statement.
type refreshReq struct {
	hs   []*sharedLease
	ttls []time.Duration
	errs []error // set by refreshPending
}

// refreshPending sends the session's pending refreshes in one statement,
// which restarts its idle timer and sets idle_session_timeout to the
// longest TTL of its leases; the run slot is held.
func (sess *session) refreshPending() {
	sess.mu.Lock()
	reqs := sess.refreshes
	sess.refreshes = nil
	if sess.gone {
		sess.mu.Unlock()
		for _, r := range reqs {
			for i, h := range r.hs {
				r.errs[i] = h.notHeld("refresh", errSessionGone)
			}
		}
		return
	}
	// The session's timeout covers the leases' TTLs before and after: a
	// lease's TTL changes only once the statement is answered.
	live := 0
	ttl, cur := sess.maxTTLLocked(0), sess.ttl
	for _, r := range reqs {
		for i, h := range r.hs {
			if h.gone {
				r.errs[i] = h.notHeld("refresh", errors.New("the lease has ended (released, or expired)"))
				continue
			}
			live++
			ttl = max(ttl, r.ttls[i])
		}
	}
	sess.mu.Unlock()
	if live == 0 {
		return
	}
	sent := time.Now()
	var pid int32
	var err error
	if sess.set.d.checkPID && ttl == cur {
		// The timeout stays: any message the server answers restarts it,
		// and a Sync alone costs least (see keepAlive). The connection
		// goes straight to the server: its backend is the one whose pid
		// the set-up and every acquisition on it checked.
		err = keepAlive(context.Background(), sess.pg)
	} else {
		ms, _ := millis(ttl)
		var idle *string
		err = sess.c.Conn().QueryRow(context.Background(), sharedRefreshSQL, sess.pid, ms).Scan(&pid, &idle)
		if err == nil && idle == nil {
			err = fmt.Errorf("%w: lease taken on backend %d, refresh ran on backend %d", ErrPooler, sess.pid, pid)
			sess.lose(err)
		}
	}
	if err != nil {
		gone := sess.failed(err) || sess.isGone()
		for _, r := range reqs {
			for i, h := range r.hs {
				if r.errs[i] == nil {
					if gone {
						r.errs[i] = h.notHeld("refresh", err)
					} else {
						r.errs[i] = fmt.Errorf("postgres: refresh of %q: %w", h.name, err)
					}
				}
			}
		}
		return
	}
	sess.mu.Lock()
	sess.ttl, sess.lastSent = ttl, sent
	for _, r := range reqs {
		for i, h := range r.hs {
			if r.errs[i] == nil && !h.gone {
				if t := r.ttls[i]; t != h.ttl {
					if sess.ttls[h.ttl]--; sess.ttls[h.ttl] <= 0 {
						delete(sess.ttls, h.ttl)
					}
					sess.ttls[t]++
					h.ttl = t
					sess.noteExpiryLocked(sent.Add(t))
				}
				h.lastSent = sent
			} else if r.errs[i] == nil {
				r.errs[i] = h.notHeld("refresh", errSessionGone)
			}
		}
	}
	sess.mu.Unlock()
}

// Held asks the session whether it holds the lease's lock (held.sql),
// which restarts the session's idle timer as any statement on it does.
func (h *sharedLease) Held(ctx context.Context) (bool, error) {
	sess := h.s
	var held *bool
	var err error
	op := func() {
		sess.mu.Lock()
		gone := h.gone || sess.gone
		ms, _ := millis(sess.ttl)
		sess.mu.Unlock()
		if gone {
			return
		}
		var pid int32
		var idle *string
		err = sess.c.Conn().QueryRow(context.Background(), heldSQL, sess.pid, h.key, ms).Scan(&pid, &held, &idle)
		if err != nil {
			sess.failed(err)
		}
	}
	if _, cerr := sess.call(ctx, op, nil); cerr != nil {
		return false, fmt.Errorf("postgres: check of %q: %w", h.name, cerr)
	}
	if err != nil {
		if sess.isGone() {
			return false, nil
		}
		return false, fmt.Errorf("postgres: check of %q: %w", h.name, err)
	}
	if held == nil || !*held {
		return false, nil
	}
	return true, nil
}

// Release unlocks the lease's key on its session (pg_advisory_unlock,
// whose result says whether the session held it). Releases that queue for
// the session while a statement runs are sent together, in one statement.
func (h *sharedLease) Release(ctx context.Context) error {
	sess := h.s
	req := &releaseReq{h: h}
	sess.mu.Lock()
	switch {
	case h.gone || sess.gone:
		sess.mu.Unlock()
		return h.notHeld("release", errSessionGone)
	case h.releasing:
		sess.mu.Unlock()
		return fmt.Errorf("postgres: release of %q: a release cut short is still under way", h.name)
	}
	h.releasing = true
	sess.pending = append(sess.pending, req)
	sess.mu.Unlock()
	ab, cerr := sess.call(ctx, sess.releasePending, nil)
	if cerr == nil {
		return req.err
	}
	if !ab {
		sess.mu.Lock()
		for i, r := range sess.pending {
			if r == req { // not sent: the lease holds on
				sess.pending = append(sess.pending[:i], sess.pending[i+1:]...)
				h.releasing = false
				sess.mu.Unlock()
				return fmt.Errorf("postgres: release of %q: %w", h.name, cerr)
			}
		}
		sess.mu.Unlock()
	}
	return fmt.Errorf("postgres: release of %q cut short (it completes in the background): %w", h.name, cerr)
}

// releaseReq is a release waiting for its session's statement.
type releaseReq struct {
	h   *sharedLease
	err error // set by releasePending
}

// sharedReleaseSQL unlocks the keys of $2, in order, on the session whose
// backend is $1 (NULLs on another backend).
const sharedReleaseSQL = `/* dlock: shared release */ SELECT CASE WHEN pg_backend_pid() = $1 THEN pg_advisory_unlock(hashtextextended(u.k, 0)) END
FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY u.i`

// releasePending sends the session's pending releases in one statement; the
// run slot is held.
func (sess *session) releasePending() {
	sess.mu.Lock()
	reqs := sess.pending
	sess.pending = nil
	var sent []*releaseReq
	var keys []string
	for _, r := range reqs {
		if r.h.gone || sess.gone {
			r.err = r.h.notHeld("release", errSessionGone)
			continue
		}
		r.h.forgetLocked(false)
		sent, keys = append(sent, r), append(keys, r.h.key)
	}
	sess.mu.Unlock()
	if len(sent) == 0 {
		return
	}
	oks := make([]*bool, 0, len(sent))
	var rows pgx.Rows
	var err error
	if len(sent) == 1 && sess.set.d.checkPID && sent[0].h.keyB != nil {
		// One release: a fast-path call of pg_advisory_unlock, as a
		// dedicated lease's (see fastUnlock), on the backend that the
		// set-up and every acquisition on this connection checked.
		var ok bool
		if ok, err = fastUnlock(context.Background(), sess.pg, &sess.unlock, sent[0].h.keyB); err == nil {
			oks = append(oks, &ok)
		}
	} else if rows, err = sess.c.Conn().Query(context.Background(), sharedReleaseSQL, sess.pid, keys); err == nil {
		for rows.Next() {
			var ok *bool
			if err = rows.Scan(&ok); err != nil {
				break
			}
			oks = append(oks, ok)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err == nil && len(oks) != len(sent) {
		err = fmt.Errorf("%d rows for %d unlocks", len(oks), len(sent))
	}
	if err != nil {
		// Unknown what was unlocked: the session must end.
		sess.lose(&connError{err})
	}
	for i, r := range sent {
		switch {
		case err != nil:
			r.err = r.h.notHeld("release", err)
		case oks[i] == nil || !*oks[i]:
			sess.lose(errors.New("the session did not hold a lease's lock"))
			r.err = r.h.notHeld("release", errors.New("the session did not hold the lock"))
		}
		sess.set.unreserve(r.h.key)
		sess.set.done(sess)
	}
}
