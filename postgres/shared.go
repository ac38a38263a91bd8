package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
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
	h.place.Store(&s.waits)
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

// Capabilities is the driver's, with SharedMinTTL when every lock shares
// a session (by default a shorter TTL takes a connection of its own).
func (d sharedDriver) Capabilities() dlock.Capabilities {
	c := d.driver.Capabilities()
	if d.own == nil {
		c.MinTTL = SharedMinTTL
	}
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
