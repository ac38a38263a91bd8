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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Shared sessions (Options.SharedSessions): the advisory locks of many
// leases stacked on a few sessions, instead of a connection per lease.
//
// A lock (KindLock, without metadata) is taken by pg_try_advisory_lock on a
// shared session of its TTL class; only when that finds the lock busy does a
// waiting Acquire take a dedicated connection, from a bounded set
// (Options.WaitConns), and wait in pg_advisory_lock there; the lock it is
// granted stays on that connection, as without shared sessions. Moving it
// to a shared session would leave a moment where neither holds it, and
// another waiter would be granted it; waiting on the server, rather than
// trying again when told of a release, keeps PostgreSQL's FIFO queue and
// hears releases of every holder (other processes, psql), which a
// notification sent by this driver's releases would not. Since a try-lock
// conflicts with the waiters queued on a lock, a try on a shared session
// never overtakes them.
//
// A shared session's idle_session_timeout is the longest TTL of its leases;
// every statement on it (a lease's refresh, a batch of refreshes, an
// acquisition) restarts it for all of them. A lease's own expiry is kept by
// the driver: a lease left unrefreshed past its TTL is unlocked on its
// session by the sweep and reported lost. A process that goes silent loses
// every lease when the server ends the session, a TTL after its last
// statement. The end of a session (a reset, pg_terminate_backend, an
// expiry) loses exactly the leases on it, each reporting it.
//
// Two leases of one name must never both be granted on one session (a
// session's advisory locks stack): a name held or being taken on a shared
// session is busy for the Locker's other attempts, which wait on a
// dedicated connection.

// Defaults of the shared-session options.
const (
	DefaultSharedConns = 4
	DefaultWaitConns   = 16
)

// sharedSet is the driver's shared sessions and waiting connections.
type sharedSet struct {
	d        *driver
	perClass int           // sessions per TTL class
	waits    chan struct{} // a token per waiting connection in use
	nWaits   int

	mu       sync.Mutex
	classes  map[string][]*session // by the TTL, in ms, of their first acquisition
	held     map[string]struct{}   // key texts held or being taken on a shared session
	busy     map[string]time.Time  // key texts an Acquire found held elsewhere, and when (see acquire)
	all      map[*session]struct{}
	sweeping bool
}

func newSharedSet(d *driver, conns, waits int) *sharedSet {
	if conns <= 0 {
		conns = DefaultSharedConns
	}
	if waits <= 0 {
		waits = DefaultWaitConns
	}
	return &sharedSet{
		d: d, perClass: conns, waits: make(chan struct{}, waits), nWaits: waits,
		classes: make(map[string][]*session),
		held:    make(map[string]struct{}),
		busy:    make(map[string]time.Time),
		all:     make(map[*session]struct{}),
	}
}

// session is one shared session: a connection kept out of the pool while
// it holds leases.
type session struct {
	set   *sharedSet
	class string
	ready chan struct{} // closed once set up (or failed: then gone)
	c     *pgxpool.Conn
	pg    *pgconn.PgConn
	pid   int32
	pidB  []byte    // acquire.sql's pid check: pid, or 0 without the check (binary int4)
	orig  [2]string // the settings before: idle_session_timeout, synchronous_commit
	run   chan struct{}
	users int       // under set.mu: leases, and acquisitions under way
	empty time.Time // under set.mu: since when users is 0

	mu       sync.Mutex
	leases   map[*sharedLease]struct{}
	ttls     map[time.Duration]int // the leases' TTLs, counted
	ttl      time.Duration         // idle_session_timeout as last set
	lastSent time.Time             // when the last statement was sent
	// nextExpiry is at or before the earliest lastSent+ttl of the leases
	// (zero: no lease to look at), so that the sweep looks at every lease
	// only once one may have expired, not every round (see sweep)
	nextExpiry time.Time
	idle       time.Time // when the last statement ended
	busy       bool
	gone       bool
	watching   bool
	stopping   bool
	watched    chan struct{}
	err        error         // why it ended
	pending    []*releaseReq // releases waiting for the run slot
	refreshes  []*refreshReq // refreshes waiting for the run slot
	unlock     unlockCall    // releasePending's fast-path call; the run slot is held
}

// sharedLease is the Handle of a lock held on a shared session.
type sharedLease struct {
	s    *session
	key  string // KeyPrefix + name
	keyB []byte // the lock's int8 key, in binary (fastUnlock's argument)
	name string
	// under s.mu
	ttl       time.Duration
	lastSent  time.Time
	gone      bool
	lost      bool
	releasing bool // a release is pending or under way
	onLost    func()
}

// errSessionGone is why the operations of a lease whose shared session
// ended fail.
var errSessionGone = errors.New("the shared session holding the lease has ended")

// acquire takes req (a KindLock without metadata) on a shared session, or,
// when it is busy and wait is set, waits for it on a dedicated connection.
func (s *sharedSet) acquire(ctx context.Context, req dlockdriver.Request, ms string, wait bool) (*dlockdriver.Grant, error) {
	key := s.d.prefix + req.Name
	s.mu.Lock()
	if _, busy := s.held[key]; busy {
		s.mu.Unlock()
		if wait {
			return s.waitDedicated(ctx, req, ms)
		}
		return nil, dlockdriver.Busy(0)
	}
	if at, ok := s.busy[key]; ok && wait {
		// Found held elsewhere a moment ago: wait at once on a connection
		// of its own, if one is free, rather than try on a shared session
		// first (a round trip and a transaction more, on a session the
		// other leases share), as Acquires of a contended name would.
		if time.Since(at) < busyFor && s.takeWaitSlot() {
			s.mu.Unlock()
			return s.waitWithSlot(ctx, req, ms, key)
		}
		delete(s.busy, key)
	}
	s.held[key] = struct{}{}
	sess, created := s.pickLocked(ms)
	s.mu.Unlock()
	if created {
		sess.setUp(ctx, req.TTL, ms)
	}
	g, abandoned, err := sess.try(ctx, req, key, ms)
	if g != nil || abandoned {
		return g, err // an abandoned attempt cleans up after itself
	}
	s.unreserve(key)
	s.done(sess)
	switch {
	case err != nil:
		return nil, err
	case !wait:
		return nil, dlockdriver.Busy(0)
	}
	s.mu.Lock()
	if len(s.busy) >= maxBusy {
		clear(s.busy)
	}
	s.busy[key] = time.Now()
	s.mu.Unlock()
	return s.waitDedicated(ctx, req, ms)
}

// An Acquire of a name that an Acquire of the Locker found held elsewhere
// within busyFor waits at once on a connection of its own (see acquire);
// the Locker remembers maxBusy such names at most.
const (
	busyFor = time.Second
	maxBusy = 1024
)

// pickLocked chooses a session of the class ms, counting the acquisition
// as its user: a new one while the class has fewer than perClass and all
// are running a statement, else the one with fewest users. s.mu is held.
func (s *sharedSet) pickLocked(ms string) (*session, bool) {
	list := s.classes[ms]
	var best *session
	allBusy := true
	for _, x := range list {
		if best == nil || x.users < best.users {
			best = x
		}
		if len(x.run) == 0 {
			allBusy = false
		}
	}
	if best == nil || (allBusy && len(list) < s.perClass) {
		best = &session{
			set: s, class: ms, ready: make(chan struct{}), run: make(chan struct{}, 1),
			leases: make(map[*sharedLease]struct{}), ttls: make(map[time.Duration]int),
		}
		s.classes[ms] = append(list, best)
		s.all[best] = struct{}{}
		best.users++
		s.startSweepLocked()
		return best, true
	}
	best.users++
	return best, false
}

func (s *sharedSet) unreserve(key string) {
	s.mu.Lock()
	delete(s.held, key)
	s.mu.Unlock()
}

// done ends a use of sess (a lease, or an acquisition that did not take
// one). A session without users stays for linger, then the sweep gives it
// back to the pool.
func (s *sharedSet) done(sess *session) {
	s.mu.Lock()
	if sess.users--; sess.users == 0 {
		sess.empty = time.Now()
	}
	s.mu.Unlock()
}

// retireIdle gives back sess if it has had no user for linger: half its
// idle_session_timeout, so that the server does not end it meanwhile, and
// at most two watchDelays.
func (s *sharedSet) retireIdle(sess *session, now time.Time, ttl time.Duration) {
	s.mu.Lock()
	if sess.users != 0 || now.Sub(sess.empty) < min(ttl/2, 2*watchDelay) {
		s.mu.Unlock()
		return
	}
	s.removeLocked(sess)
	sess.users = -1 // never picked again
	s.mu.Unlock()
	sess.retire()
}

// removeLocked takes sess out of its class; s.mu is held.
func (s *sharedSet) removeLocked(sess *session) {
	list := s.classes[sess.class]
	for i, x := range list {
		if x == sess {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.classes, sess.class)
	} else {
		s.classes[sess.class] = list
	}
}

// waitDedicated waits for req in pg_advisory_lock on a connection of its
// own, one of at most nWaits: past them it fails at once with
// dlock.ErrResourceLimit. The lock granted stays on that connection.
func (s *sharedSet) waitDedicated(ctx context.Context, req dlockdriver.Request, ms string) (*dlockdriver.Grant, error) {
	if !s.takeWaitSlot() {
		return nil, fmt.Errorf("%w: postgres: all %d waiting connections are in use (each Acquire that finds its lock busy waits on one, and keeps it for the lease it is granted): raise wait_conns, within pool_max_conns",
			dlock.ErrResourceLimit, s.nWaits)
	}
	return s.waitWithSlot(ctx, req, ms, "")
}

// takeWaitSlot takes a place among the waiting connections, if one is free.
func (s *sharedSet) takeWaitSlot() bool {
	select {
	case s.waits <- struct{}{}:
		return true
	default:
		return false
	}
}

// waitWithSlot is waitDedicated with its place taken. key, when not empty,
// is the name's key text, found held elsewhere a moment ago: a grant that
// did not wait forgets that, one that waited remembers it again.
func (s *sharedSet) waitWithSlot(ctx context.Context, req dlockdriver.Request, ms, key string) (*dlockdriver.Grant, error) {
	g, err := s.d.acquireConn(ctx, req, ms, true)
	if err != nil {
		<-s.waits
		return nil, err
	}
	h := g.Handle.(*lease)
	h.waitSlot.Store(true)
	if key != "" {
		s.mu.Lock()
		if h.waited < 0.001 {
			delete(s.busy, key)
		} else {
			s.busy[key] = time.Now() // it waited: still contended
		}
		s.mu.Unlock()
	}
	return g, nil
}

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

// sharedDriver is the driver with shared sessions: it refreshes a batch of
// leases by one statement per session (dlockdriver.BatchRefresher).
type sharedDriver struct{ *driver }

// SharedMinTTL is the shortest TTL with Options.SharedSessions: the
// statements of many leases queue on one connection, and the Locker
// refreshes them in batches that complete together, so a TTL of MinTTL
// leaves a lease too little room: at 100ms the conformance suite lost
// leases on a loaded machine (load 6-10 on 2 cores) more often than without
// shared sessions (FIFOOrder's holder, in three runs of three).
const SharedMinTTL = 500 * time.Millisecond

// Capabilities is the driver's, with SharedMinTTL.
func (d sharedDriver) Capabilities() dlock.Capabilities {
	c := d.driver.Capabilities()
	c.MinTTL = SharedMinTTL
	return c
}

// RefreshBatch implements dlockdriver.BatchRefresher: one statement per
// session of the batch (with the batches queued for it meanwhile).
func (d sharedDriver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	errs := make([]error, len(hs))
	type group struct {
		s   *session
		n   int
		idx []int
		hs  []*sharedLease
		tt  []time.Duration
	}
	// A Locker has a few sessions per TTL: a list, looked up from the last
	// one found (a batch's leases come in runs of one session); counted
	// first, so that each group's slices are made once.
	var groups []*group
	var last *group
	find := func(s *session) *group {
		if last != nil && last.s == s {
			return last
		}
		for _, g := range groups {
			if g.s == s {
				last = g
				return g
			}
		}
		last = &group{s: s}
		groups = append(groups, last)
		return last
	}
	var wg sync.WaitGroup
	for i, x := range hs {
		if h, ok := x.(*sharedLease); ok {
			find(h.s).n++
			continue
		}
		// A lease on a connection of its own (a wait's, another kind's)
		// refreshes alone, as without batches.
		wg.Go(func() { _, errs[i] = x.Refresh(ctx, ttls[i]) })
	}
	for _, g := range groups {
		g.idx, g.hs, g.tt = make([]int, 0, g.n), make([]*sharedLease, 0, g.n), make([]time.Duration, 0, g.n)
	}
	for i, x := range hs {
		if h, ok := x.(*sharedLease); ok {
			g := find(h.s)
			g.idx, g.hs, g.tt = append(g.idx, i), append(g.hs, h), append(g.tt, ttls[i])
		}
	}
	for _, g := range groups {
		wg.Go(func() {
			for j, err := range g.s.refresh(ctx, g.hs, g.tt) {
				errs[g.idx[j]] = err
			}
		})
	}
	wg.Wait()
	return nil, errs
}

// close loses every shared session (the Locker released their leases).
func (s *sharedSet) close() {
	s.mu.Lock()
	list := make([]*session, 0, len(s.all))
	for x := range s.all {
		list = append(list, x)
	}
	s.mu.Unlock()
	for _, x := range list {
		<-x.ready
		x.run <- struct{}{} // wait for a statement under way
		x.lose(dlock.ErrClosed)
		<-x.run
	}
}
