// Package zookeeper is the dlock driver for Apache ZooKeeper, built on
// github.com/go-zookeeper/zk: a FIFO lock queue of ephemeral-sequential
// znodes, with fencing tokens and session-aware loss detection.
//
// # URLs
//
//	zk://[user:password@]host1:2181[,host2:2181,…][/root][?params]
//
// The hosts form the ensemble (port 2181 when left out). The path is the
// root znode under which lock nodes live (default /dlock; see Layout). A
// user and password are added to every session as digest credentials.
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - acl: the ACL of the znodes the driver creates. open (world:anyone,
//     all permissions), creator (auth::cdrwa: only sessions with the same
//     credentials), read (creator, plus read for everyone), or a
//     comma-separated list of scheme:id:perms entries in zkCli's notation,
//     such as world:anyone:r,digest:app:HASH=:cdrwa or ip:10.0.0.0/8:cdrwa.
//     Default: creator with credentials in the URL, open without.
//
// Unknown parameters are rejected. Open connects, bounded by its ctx (see
// Connect), so a wrong address fails there. go-zookeeper's log output is
// discarded (Options.Logger turns it back on).
//
// # Guarantees
//
// Each lease is one ephemeral-sequential znode; the lowest one under a name
// holds the lock, and each waiter watches only its immediate predecessor, so
// waiters are granted in arrival order (Capabilities.FIFO) and a release wakes
// exactly one of them. Within one ensemble a lock is held by at most one
// session at a time: ZooKeeper's writes are linearizable, and an ephemeral
// node lives exactly as long as its session.
//
// The TTL is the session timeout. A Locker made by Connect runs one session
// per distinct TTL (its own TCP connection, shared by every lease and waiter
// with that TTL), asks the server for the TTL as the session timeout and
// reports the timeout the server negotiated as the lease's TTL; a TTL outside
// the server's minSessionTimeout..maxSessionTimeout is rejected with
// dlock.ErrInvalid (Capabilities.MinTTL is the server's minimum, learnt at
// Connect). Refresh with another TTL moves the lock node into a session with
// that timeout, atomically (one multi-op deletes it and creates it again under
// the same name), keeping its place and its fencing token.
//
// The server drops a session, and its lock nodes, when it has not heard from
// it for the session timeout. go-zookeeper pings the server every third of
// it, whether or not leases are refreshed, so a lease that is not refreshed
// (NoRefresh, or a watchdog that cannot reach the server) has its node
// deleted by the driver once its TTL has passed since the last refresh was
// sent. A refresh is one read of the lease's node, checking that it is still
// there and still owned by the lease's session; the lease's ValidUntil counts
// from when it was sent (from when Acquire was called, for a lock granted
// without waiting), so it is never later than the moment the server could
// expire the session.
//
// Session states: while go-zookeeper is disconnected (suspended), refreshes
// fail and the lease stays valid until its ValidUntil, then reports loss; if
// the connection comes back in time the session, its nodes and the lease
// carry on. A server restart is survived the same way: standalone and
// ensemble servers keep sessions on disk, and the session timeout starts
// again when the server comes back (Capabilities.SurvivesRestart). When the
// server expired the session, its leases are lost as soon as the driver
// hears of it (go-zookeeper then opens a new session on the same connection;
// nothing of the old one is ever reported as held), and its waiters queue
// again at the end.
//
// What the server may keep after a holder's ValidUntil (ExpirySlack): a
// holder cut off from the server keeps its node until the session timeout
// after the server last heard from it, rounded up to the server's tick. With
// the watchdog on, that is at most RefreshInterval plus a tick after the
// lease's ValidUntil; a lease without refresh cut off just before its TTL
// runs out, up to a whole TTL more. Capabilities.ExpirySlack reports the tick
// part (the server's minimum session timeout).
//
// The fencing token is the lock node's creation zxid (czxid): ZooKeeper's
// transaction ids strictly increase, so tokens follow grant order across
// holders, expiry takeovers and the name node's deletion; they are not
// consecutive. A process paused past its ValidUntil still believes it holds
// the lock until it runs again; pass Lease.Fence to the resource.
//
// Every lock node the driver creates is the live lease's, a live waiter's,
// or deleted, whatever the fault: a node nobody holds or waits on would sit
// in the queue, ahead of every later waiter, for as long as its session
// lives. A cancelled attempt or wait deletes its node before it returns
// (waiting up to half the TTL, at most a second, then carrying on in the
// background, through connection trouble, until the node is gone or its
// session ended: Curator's guaranteed delete). A create whose outcome was
// lost is found again by its GUID (Curator's protected mode), and any other
// node with the GUID is deleted; a create that go-zookeeper sent on a new
// session after the old one expired is taken as the new session's. When a
// session of the driver's own resumes after a disconnection, the names it
// has locks or waiters under are swept for nodes of the session that no
// lease or waiter tracks. A release whose delete fails leaves the lease
// valid until its ValidUntil, as dlock documents; the driver deletes the
// node then.
//
// A Locker made by New uses the application's *zk.Conn for everything: one
// session, so TTLs above its timeout are rejected, shorter ones are enforced
// by the driver, and a holder cut off from the server keeps its nodes for the
// session timeout (ExpirySlack). go-zookeeper does not tell the driver when
// that session expires; the driver finds out at the next refresh.
//
// # Layout
//
// With R the root (default /dlock) and N the lock name escaped into one path
// component (see LockPath):
//
//	R                          persistent, created when missing
//	R/N                        container node: the server deletes it once it
//	                           is empty (znode.container.checkIntervalMs, a
//	                           minute by default)
//	R/N/_c_<guid>-lock-<seq>   ephemeral-sequential: one per lease or waiter;
//	                           the GUID is the lease's token, the data its
//	                           metadata
//
// This is the layout of Apache Curator's InterProcessMutex and of
// go-zookeeper's zk.Lock: dlock, Curator and zk.Lock locks on the path
// LockPath(root, name) exclude each other and queue together. Each lock node
// is created in one transaction with an (empty) write to R/N, whose reply
// carries the transaction's zxid, the new node's czxid: the driver needs
// read, write, create and delete permissions on R/N.
package zookeeper

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/go-zookeeper/zk"
)

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options, except that New defaults the TTL
	// to SessionTimeout.
	Defaults dlock.Options

	// Root is the znode under which lock nodes live (URL: the path).
	// Default DefaultRoot.
	Root string

	// ACL is the ACL of every znode the driver creates (URL: acl). Default:
	// zk.AuthACL(zk.PermAll) (only the same credentials) when Auth is set,
	// zk.WorldACL(zk.PermAll) otherwise.
	ACL []zk.ACL

	// Auth are credentials added to every session the driver dials (URL: the
	// user and password, as digest credentials). Connect only.
	Auth []Auth

	// Dialer dials the servers (for example through TLS). Default:
	// net.Dialer. Connect only.
	Dialer zk.Dialer

	// Logger receives go-zookeeper's log output. Default: none. Connect only.
	Logger zk.Logger

	// SessionTimeout is the session timeout the application's connection
	// was negotiated with (zk.Connect's, unless the server changed it). New
	// only, and required there: TTLs above it are rejected, and it is how
	// long the server keeps the locks of a holder cut off from it.
	SessionTimeout time.Duration
}

// Auth is one set of credentials, as given to zk.Conn.AddAuth.
type Auth struct {
	Scheme string // "digest"
	Secret []byte // "user:password" for digest
}

// probeTimeout is the session timeout Connect asks for to learn the server's
// minimum: a server whose minimum is lower grants it, and it is then the
// shortest TTL the Locker accepts.
const probeTimeout = 100 * time.Millisecond

// Connect returns a Locker on the ensemble at servers (host:port, port 2181
// when left out) that dials its own sessions, one per distinct TTL. ctx
// bounds connecting: Connect opens one short session to check the servers
// and credentials and to learn the server's minimum session timeout. Close
// the Locker to close every session.
func Connect(ctx context.Context, servers []string, opts *Options) (*dlock.Locker, error) {
	d, o, err := connect(ctx, servers, opts)
	if err != nil {
		return nil, err
	}
	l, err := dlock.New(d, &o.Defaults)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}

// connect is Connect without the Locker: the driver and its resolved
// Options.
func connect(ctx context.Context, servers []string, opts *Options) (*driver, Options, error) {
	if len(servers) == 0 {
		return nil, Options{}, invalid("no servers")
	}
	srvs := zk.FormatServers(servers)
	for _, s := range srvs {
		if host, port, err := net.SplitHostPort(s); err != nil || host == "" || port == "" {
			return nil, Options{}, invalid("server %q is not host:port", s)
		}
	}
	d, o, err := newDriver(opts)
	if err != nil {
		return nil, o, err
	}
	d.servers = srvs
	d.dialer = o.Dialer
	d.logger = o.Logger
	if d.logger == nil {
		d.logger = log.New(io.Discard, "", 0)
	}
	d.auth = o.Auth
	minTTL, err := d.probe(ctx)
	if err != nil {
		_ = d.Close()
		return nil, Options{}, fmt.Errorf("zookeeper: connecting to %s: %w", strings.Join(srvs, ","), err)
	}
	d.caps.MinTTL = minTTL
	d.caps.ExpirySlack = minTTL
	if testHookConnected != nil {
		testHookConnected(d)
	}
	return d, o, nil
}

// testHookConnected, when set by a test, is given each driver Connect makes.
var testHookConnected func(*driver)

// New returns a Locker that keeps its lock nodes in the session of the
// application's connection. opts.SessionTimeout must be that session's
// timeout. Closing the Locker does not close conn; the lock nodes of leases
// still held are deleted by Close.
func New(conn *zk.Conn, opts *Options) (*dlock.Locker, error) {
	if conn == nil {
		return nil, invalid("nil connection")
	}
	if opts == nil || opts.SessionTimeout <= 0 {
		return nil, invalid("Options.SessionTimeout must be the connection's session timeout")
	}
	if opts.Auth != nil || opts.Dialer != nil || opts.Logger != nil {
		return nil, invalid("Auth, Dialer and Logger are for Connect; set them on the connection")
	}
	d, o, err := newDriver(opts)
	if err != nil {
		return nil, err
	}
	if o.Defaults.TTL == 0 {
		o.Defaults.TTL = o.SessionTimeout
	}
	s := &session{d: d, conn: conn, ready: make(chan struct{}), ended: map[int64]struct{}{}, timeout: o.SessionTimeout}
	close(s.ready)
	s.dialCtx, s.cancel = context.WithCancel(context.Background())
	d.shared = s
	d.caps.MinTTL = 10 * time.Millisecond
	d.caps.ExpirySlack = o.SessionTimeout
	l, err := dlock.New(d, &o.Defaults)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}

func newDriver(opts *Options) (*driver, Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	if err := checkRoot(o.Root); err != nil {
		return nil, o, err
	}
	if o.ACL == nil {
		o.ACL = zk.WorldACL(zk.PermAll)
		if len(o.Auth) > 0 {
			o.ACL = zk.AuthACL(zk.PermAll)
		}
	}
	if len(o.ACL) == 0 {
		return nil, o, invalid("empty ACL")
	}
	for _, a := range o.Auth {
		if a.Scheme == "" {
			return nil, o, invalid("credentials without a scheme")
		}
	}
	d := &driver{
		root:     o.Root,
		acl:      o.ACL,
		sessions: map[int32]*session{},
		open:     map[*session]struct{}{},
		handles:  map[*handle]struct{}{},
		claims:   map[string]*claim{},
		caps: dlock.Capabilities{
			Fencing:         true,
			FIFO:            true,
			NotifiedWait:    true,
			SurvivesRestart: true,
		},
	}
	d.ctx, d.stop = context.WithCancel(context.Background())
	return d, o, nil
}

type driver struct {
	root string
	acl  []zk.ACL
	caps dlock.Capabilities

	// Connect.
	servers []string
	dialer  zk.Dialer
	logger  zk.Logger
	auth    []Auth

	// New: the application's connection.
	shared *session

	ctx  context.Context // cancelled by Close: ends background cleanups
	stop context.CancelFunc

	mu       sync.Mutex
	sessions map[int32]*session    // owned sessions by requested timeout (ms)
	open     map[*session]struct{} // every owned session not closed yet
	maxMs    int32                 // the server's maximum session timeout, once learnt
	handles  map[*handle]struct{}
	closed   bool
	bg       sync.WaitGroup // cleanups, sweeps and idle session closes

	cmu    sync.Mutex
	claims map[string]*claim // by GUID: acquisitions and their leases (see claim)
}

func (d *driver) Capabilities() dlock.Capabilities { return d.caps }

// probe opens a session asking for probeTimeout and returns the timeout the
// server granted: the shortest TTL it can honour (or probeTimeout, if the
// server would go lower).
func (d *driver) probe(ctx context.Context) (time.Duration, error) {
	s := d.openSession(int32(probeTimeout / time.Millisecond))
	defer s.close() // not in d.open: closed here
	if err := s.wait(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.timeout, probeTimeout), nil
}

// session returns, counted as used (unref it), the session for a lock with
// that TTL: the application's, or the driver's own for that timeout, dialled
// when there is none, once it is ready.
func (d *driver) session(ctx context.Context, ttl time.Duration) (*session, error) {
	if s := d.shared; s != nil {
		if ttl > s.timeout {
			return nil, invalid("TTL %v is above the connection's session timeout %v", ttl, s.timeout)
		}
		s.ref()
		return s, nil
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	if ms > 1<<31-1 {
		return nil, invalid("TTL %v is above ZooKeeper's largest session timeout", ttl)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, dlock.ErrClosed
	}
	if d.maxMs > 0 && int32(ms) > d.maxMs {
		d.mu.Unlock()
		return nil, invalid("TTL %v is above the server's maximum session timeout %v", ttl, time.Duration(d.maxMs)*time.Millisecond)
	}
	s := d.sessions[int32(ms)]
	if s == nil {
		s = d.openSession(int32(ms))
		d.sessions[int32(ms)] = s
		d.open[s] = struct{}{}
	}
	s.ref()
	d.mu.Unlock()
	if err := s.wait(ctx); err != nil {
		s.unref()
		return nil, err
	}
	s.mu.Lock()
	got := s.timeout
	s.mu.Unlock()
	if got == time.Duration(ms)*time.Millisecond {
		return s, nil
	}
	// The server negotiated another timeout: it cannot honour this TTL.
	d.mu.Lock()
	if got < time.Duration(ms)*time.Millisecond && (d.maxMs == 0 || int32(got/time.Millisecond) < d.maxMs) {
		d.maxMs = int32(got / time.Millisecond)
	}
	if d.sessions[int32(ms)] == s {
		delete(d.sessions, int32(ms))
	}
	d.mu.Unlock()
	s.unref()
	if got < ttl {
		return nil, invalid("TTL %v is above the server's maximum session timeout %v", ttl, got)
	}
	return nil, invalid("TTL %v is below the server's minimum session timeout %v", ttl, got)
}

// parent returns the znode of name.
func (d *driver) parent(name string) string { return LockPath(d.root, name) }

// goBG runs f in the background, counted for Close; false once closed.
func (d *driver) goBG(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		f()
	}()
	return true
}

// Close stops the cleanups, closes the driver's own sessions (the server
// deletes their nodes at once) and, on the application's connection, deletes
// the nodes of leases that were lost but not cleaned up yet (bounded by a
// second).
func (d *driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	sessions := make([]*session, 0, len(d.open))
	for s := range d.open {
		sessions = append(sessions, s)
	}
	clear(d.sessions)
	clear(d.open)
	handles := make([]*handle, 0, len(d.handles))
	for h := range d.handles {
		handles = append(handles, h)
	}
	d.mu.Unlock()
	for _, h := range handles {
		h.stopTimer()
	}
	if d.shared != nil && len(handles) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var wg sync.WaitGroup
		for _, h := range handles {
			wg.Go(func() { h.deleteOnClose(ctx) })
		}
		wg.Wait()
		cancel()
	}
	d.stop()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(s.close)
	}
	wg.Wait()
	d.bg.Wait()
	if d.shared != nil {
		d.shared.cancel()
	}
	return nil
}

func (d *driver) track(h *handle) {
	d.mu.Lock()
	d.handles[h] = struct{}{}
	d.mu.Unlock()
}

func (d *driver) untrack(h *handle) {
	d.mu.Lock()
	delete(d.handles, h)
	d.mu.Unlock()
}

// notHeld is the error of a lease whose node is gone.
func notHeld(path, why string) error {
	return fmt.Errorf("%w: zookeeper: %s %s", dlock.ErrNotHeld, path, why)
}
