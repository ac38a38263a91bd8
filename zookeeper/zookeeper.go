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
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/reach"
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

// probeDialTimeout bounds the check that some server accepts connections.
const probeDialTimeout = 5 * time.Second

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
	if o.Dialer == nil {
		// go-zookeeper retries a refused connection until ctx ends: when no
		// server accepts one at all, say so at once.
		if err := reach.Any(ctx, srvs, probeDialTimeout); err != nil {
			_ = d.Close()
			return nil, Options{}, fmt.Errorf("zookeeper: connecting to %s: %w", strings.Join(srvs, ","), err)
		}
	}
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
		watches:  map[string]childWatch{},
		parents:  map[string]struct{}{},
		caps: dlock.Capabilities{
			Fencing:         true,
			FIFO:            true,
			NotifiedWait:    true,
			SurvivesRestart: true,
			Metadata:        true,
			Semaphore:       true,
			RWLock:          true,
			Records:         true, // record.go
			DurableRecords:  true,
			// Not PermitFencing: a permit node's czxid does not follow grant
			// order (a newcomer can be granted a free permit before an older
			// waiter, entitled too, has heard of its own grant).
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
	swept    time.Time      // the last sweep of expired records (record.go)

	cmu    sync.Mutex
	claims map[string]*claim // by GUID: acquisitions and their leases (see claim)

	wmu     sync.Mutex
	watches map[string]childWatch // by lock parent: Watch's shared watches

	pmu     sync.Mutex
	parents map[string]struct{} // name nodes seen to exist (see knownParent)
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

// parent returns the znode of the lock name.
func (d *driver) parent(name string) string { return LockPath(d.root, name) }

// parentOf returns the znode of kind k's object name: the lock's, the
// semaphore's or the read/write lock's.
func (d *driver) parentOf(k dlockdriver.Kind, name string) string {
	switch k {
	case dlockdriver.KindPermit:
		return SemaphorePath(d.root, name)
	case dlockdriver.KindRead, dlockdriver.KindWrite:
		return RWLockPath(d.root, name)
	}
	return d.parent(name)
}

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
