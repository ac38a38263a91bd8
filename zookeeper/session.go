package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	ibackoff "github.com/dlock/dlock/internal/backoff"
	izk "github.com/dlock/dlock/internal/zk"
	"github.com/go-zookeeper/zk"
)

// zkConn is what the driver calls on a ZooKeeper connection: the
// application's upstream *zk.Conn (New), or the patched copy's *izk.Conn
// (internal/zk) of a session the driver dials itself, whose types and
// errors are upstream's.
type zkConn interface {
	AddAuth(scheme string, auth []byte) error
	Children(path string) ([]string, *zk.Stat, error)
	ChildrenW(path string) ([]string, *zk.Stat, <-chan zk.Event, error)
	Close()
	Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	CreateContainer(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	Delete(path string, version int32) error
	Exists(path string) (bool, *zk.Stat, error)
	ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error)
	Get(path string) ([]byte, *zk.Stat, error)
	GetW(path string) ([]byte, *zk.Stat, <-chan zk.Event, error)
	Multi(ops ...any) ([]zk.MultiResponse, error)
	SessionID() int64
	Set(path string, data []byte, version int32) (*zk.Stat, error)
}

var (
	_ zkConn = (*zk.Conn)(nil)
	_ zkConn = (*izk.Conn)(nil)
)

// session is one ZooKeeper session the driver keeps lock nodes in: a
// connection of the driver's own, dialled for one session timeout (Connect)
// with the patched copy of go-zookeeper in internal/zk, or the application's
// *zk.Conn (New).
//
// go-zookeeper reconnects by itself, and after the server expired the session
// it silently starts a new one on the same zk.Conn. A session is therefore a
// sequence of generations, one per server-side session ID: nodes and leases
// belong to the generation they were created in, and end with it.
type session struct {
	d     *driver
	owned bool  // the driver's own zk.Conn, closed with the session
	key   int32 // owned: the requested timeout in ms, the key in driver.sessions

	conn   zkConn
	events <-chan zk.Event // owned: closed by go-zookeeper once its goroutines are done
	socks  socketSet       // owned: the sockets dialled, closed by close
	hosts  *hostProvider   // owned

	// ready is closed once the session can be used: owned, when the first
	// generation started and the credentials were added (setupErr says if
	// that failed); at once otherwise.
	ready    chan struct{}
	setupErr error
	started  chan struct{}   // owned: closed when the first generation starts
	dialCtx  context.Context // cancelled by close: ends dials in progress
	cancel   context.CancelFunc

	mu        sync.Mutex
	gen       *generation        // the live generation, nil between two
	ended     map[int64]struct{} // session IDs whose generation ended
	timeout   time.Duration      // negotiated (owned); Options.SessionTimeout (New)
	handshake struct {           // the last connect response read on a socket
		sid     int64
		timeout int32
	}
	// epoch counts the connections the owned session has had (each
	// StateHasSession): a watch lives on the server connection that set
	// it, until go-zookeeper sets it again on the next (see batch.go).
	epoch uint64
	// unsettled, when not nil, is closed once go-zookeeper has sent the
	// watches again after a reconnection (see settle); do waits for it.
	unsettled  chan struct{}
	sentinel   *generation // the generation whose sentinel watch is set (see setSentinel)
	refs       int         // acquisitions, leases, cleanups and sweeps using the session
	idle       *time.Timer
	closing    bool
	sweeping   bool           // owned: a sweep runs (see resumed)
	sweepAgain bool           // owned: and another must follow it
	calls      sync.WaitGroup // goroutines running a call on conn
	queued     []*groupOp     // operations for the next grouped request (see multi)
	flights    int            // flush goroutines running
}

// generation is one server-side session.
type generation struct {
	sid     int64
	timeout time.Duration // the negotiated session timeout
	gone    chan struct{} // closed when it ends: expired, or closed
	handles map[*handle]struct{}
}

// errNoSession is a transient error: the session is between generations.
var errNoSession = errors.New("zookeeper: no live session (reconnecting)")

// idleAfter is how long an owned session with no lease and no acquisition
// stays open, in case another lock with the same TTL comes.
var idleAfter = func(timeout time.Duration) time.Duration { return max(timeout, 5*time.Second) }

// openSession dials a new session of the driver's own with the given
// requested timeout. It returns at once; ready is closed when it is usable.
func (d *driver) openSession(ms int32) *session {
	s := &session{d: d, owned: true, key: ms, ready: make(chan struct{}), started: make(chan struct{}), ended: map[int64]struct{}{}}
	s.dialCtx, s.cancel = context.WithCancel(context.Background())
	s.mu.Lock() // the event callback may run before Connect returns
	s.hosts = &hostProvider{}
	c, events, err := izk.Connect(d.servers, time.Duration(ms)*time.Millisecond,
		izk.WithDialer(s.dial),
		izk.WithHostProvider(s.hosts),
		izk.WithLogger(d.logger),
		izk.WithLogInfo(false),
		izk.WithEventCallback(s.onEvent),
	)
	if err != nil { // only for an empty server list, which Connect rejected
		s.setupErr = fmt.Errorf("zookeeper: %w", err)
		close(s.ready)
		s.mu.Unlock()
		return s
	}
	s.conn, s.events = c, events
	s.calls.Add(1)
	s.mu.Unlock()
	go s.setup()
	return s
}

// setup waits for the first generation, then adds the credentials, retrying
// through connection trouble (go-zookeeper re-sends them by itself after a
// reconnect only once they were accepted), then marks the session ready.
func (s *session) setup() {
	defer s.calls.Done()
	defer close(s.ready)
	select {
	case <-s.started:
	case <-s.dialCtx.Done():
		s.setupErr = zk.ErrClosing
		return
	}
	for _, a := range s.d.auth {
		b := backoff{}
		for {
			err := s.conn.AddAuth(a.Scheme, a.Secret)
			if err == nil {
				break
			}
			if !transient(err) || !b.sleep(s.dialCtx, nil) {
				s.setupErr = fmt.Errorf("zookeeper: adding %s credentials: %w", a.Scheme, err)
				return
			}
		}
	}
}

// wait returns once s is ready, or ctx ends.
func (s *session) wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.setupErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dial is the zk.Dialer of an owned session: it tracks the socket and reads
// the session's negotiated timeout off the connect response.
func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var (
		c   net.Conn
		err error
	)
	if s.d.dialer != nil {
		c, err = s.d.dialer(network, addr, timeout)
	} else {
		nd := net.Dialer{Timeout: timeout}
		c, err = nd.DialContext(s.dialCtx, network, addr)
	}
	if err != nil {
		return nil, err
	}
	sc := &sniffConn{Conn: c, s: s}
	if !s.socks.add(sc) {
		_ = c.Close()
		return nil, zk.ErrClosing
	}
	return sc, nil
}

// onEvent is the owned session's zk.EventCallback: it runs in go-zookeeper's
// goroutine and must not block or call the connection.
func (s *session) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateDisconnected:
		s.mu.Lock()
		if s.unsettled == nil && !s.closing {
			s.unsettled = make(chan struct{})
		}
		s.mu.Unlock()
	case zk.StateHasSession:
		s.mu.Lock()
		s.epoch++
		hs := s.handshake
		s.timeout = time.Duration(hs.timeout) * time.Millisecond
		resumed := s.gen != nil && s.gen.sid == hs.sid
		ended := s.observe(hs.sid)
		if !resumed || s.sentinel != s.gen {
			// No watch to set again (a new session has none), or perhaps
			// none: go-zookeeper sends no SetWatches to wait for.
			s.settle()
		}
		g := s.gen
		s.mu.Unlock()
		s.end(ended)
		if resumed {
			s.resumed()
		} else {
			s.setSentinel(g)
		}
	case zk.StateExpired:
		s.mu.Lock()
		ended := s.observe(0)
		s.mu.Unlock()
		s.end(ended)
	}
}

// observe records that the connection's session is now sid (0: none) and
// returns the generation that thereby ended, if any; s.mu held. A session
// ID whose generation ended never starts a new one.
func (s *session) observe(sid int64) *generation {
	if s.gen != nil && s.gen.sid == sid {
		return nil
	}
	if _, dead := s.ended[sid]; dead {
		return nil
	}
	old := s.gen
	s.gen = nil
	if old != nil {
		s.ended[old.sid] = struct{}{}
	}
	if sid != 0 {
		s.gen = &generation{sid: sid, timeout: s.timeout, gone: make(chan struct{}), handles: map[*handle]struct{}{}}
		if s.started != nil {
			select {
			case <-s.started:
			default:
				close(s.started)
			}
		}
	}
	return old
}

// end ends a generation (nil: nothing): the leases in it are lost, their
// nodes gone with it.
func (s *session) end(g *generation) {
	if g == nil {
		return
	}
	s.mu.Lock()
	close(g.gone)
	hs := g.handles
	g.handles = nil
	s.mu.Unlock()
	for h := range hs {
		h.gone(g)
	}
}

// live returns the live generation, or nil. For the application's
// connection (no events) it reads the connection's session ID.
func (s *session) live() *generation {
	s.mu.Lock()
	var ended *generation
	if !s.owned {
		ended = s.observe(s.conn.SessionID())
	}
	g := s.gen
	s.mu.Unlock()
	s.end(ended)
	return g
}

// connEpoch returns the live generation (nil: none) and the connection
// epoch of an owned session.
func (s *session) connEpoch() (*generation, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen, s.epoch
}

// isLive reports whether g is still the live generation.
func (s *session) isLive(g *generation) bool { return g != nil && s.live() == g }

// register adds h to g; false if g has ended.
func (s *session) register(h *handle, g *generation) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.handles == nil {
		return false
	}
	g.handles[h] = struct{}{}
	return true
}

func (s *session) unregister(h *handle, g *generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.handles != nil {
		delete(g.handles, h)
	}
}

// ref counts one more user of the session; d.mu held for an owned session
// taken from the map.
func (s *session) ref() {
	s.mu.Lock()
	s.refs++
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
}

// unref counts one user fewer; an owned session left without users closes
// after idleAfter.
func (s *session) unref() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refs--
	if s.refs > 0 || !s.owned || s.closing {
		return
	}
	if s.idle == nil {
		s.idle = time.AfterFunc(idleAfter(s.timeout), s.closeIfIdle)
	} else {
		s.idle.Reset(idleAfter(s.timeout))
	}
}

// closeIfIdle closes an owned session that still has no user.
func (s *session) closeIfIdle() {
	d := s.d
	d.mu.Lock()
	s.mu.Lock()
	if s.refs > 0 || s.closing || d.closed {
		s.mu.Unlock()
		d.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if d.sessions[s.key] == s {
		delete(d.sessions, s.key)
	}
	delete(d.open, s)
	d.bg.Add(1)
	d.mu.Unlock()
	defer d.bg.Done()
	s.close()
}

// closeTimeout bounds the wait for go-zookeeper's goroutines after Close.
const closeTimeout = 10 * time.Second

// close ends an owned session: it asks the server to close it (which deletes
// its nodes at once), then closes its sockets and waits for every goroutine
// working on it.
func (s *session) close() {
	s.mu.Lock()
	if s.closing || !s.owned {
		s.mu.Unlock()
		return
	}
	s.closing = true
	s.settle()
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
	if s.conn != nil {
		s.drainCalls()
		s.conn.Close() // waits up to 1s for the server's answer
		s.cancel()
		s.socks.closeAll()
		t := time.NewTimer(closeTimeout)
		defer t.Stop()
	drain:
		for {
			select {
			case _, ok := <-s.events:
				if !ok {
					break drain
				}
			case <-t.C:
				break drain
			}
		}
	}
	s.cancel()
	s.calls.Wait()
	s.mu.Lock()
	ended := s.observe(0)
	s.mu.Unlock()
	s.end(ended)
}

// drainTimeout bounds how long close waits for the calls in flight.
const drainTimeout = time.Second

// drainCalls waits, up to drainTimeout, for the calls in flight (none
// starts once closing is set) to have their replies. go-zookeeper's Close
// makes them return at once, while its reader may still decode their
// replies into the structures they return (a data race in go-zookeeper):
// a call abandoned by its ctx, such as an acquisition's first create, may
// be in flight when the Locker closes.
func (s *session) drainCalls() {
	select {
	case <-s.ready:
	default:
		return // no call yet; setup, counted in calls too, ends with close
	}
	done := make(chan struct{})
	go func() {
		s.calls.Wait()
		close(done)
	}()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// go-zookeeper reads the last zxid it saw when it sets its watches again
// after a reconnection, while its reader may be writing it for a reply
// that came meanwhile: a data race in go-zookeeper, which the race detector
// reports once leases keep watches (batch.go). An owned session therefore
// sends no call of its own from a disconnection until that is over: until
// go-zookeeper has written its SetWatches request on the new connection
// (seen by sniffConn), or at once for a new session (go-zookeeper then has
// no watch to set again). So that a resumed session always has one, each
// generation sets a sentinel watch, on a node never created.

// sentinelNode is the node of the sentinel watch, under the root.
const sentinelNode = "%sentinel"

// opSetWatches is ZooKeeper's opcode of go-zookeeper's SetWatches request.
const opSetWatches = 101

// settle lets the calls waiting since a disconnection go; s.mu held.
func (s *session) settle() {
	if s.unsettled != nil {
		close(s.unsettled)
		s.unsettled = nil
	}
}

// setSentinel sets the sentinel watch of generation g, in the background.
func (s *session) setSentinel(g *generation) {
	if !s.owned || g == nil {
		return
	}
	d := s.d
	d.goBG(func() {
		var b backoff
		for s.isLive(g) {
			err := s.do(d.ctx, func() error {
				_, _, _, err := s.conn.ExistsW(d.root + "/" + sentinelNode)
				return err
			}, nil)
			if err == nil {
				s.mu.Lock()
				if s.gen == g {
					s.sentinel = g
				}
				s.mu.Unlock()
				return
			}
			if !transient(err) || !b.sleep(d.ctx, g.gone) {
				return
			}
		}
	})
}

// do runs f, one call on the connection, bounded by ctx: when ctx ends first
// do returns ctx's error, and f's own result goes to late (if not nil) when
// it comes. go-zookeeper's calls take no context; each ends when the server
// answers or the connection fails or closes.
func (s *session) do(ctx context.Context, f func() error, late func(error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	for s.unsettled != nil && !s.closing {
		wait := s.unsettled
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.dialCtx.Done():
		}
		s.mu.Lock()
	}
	if s.closing {
		s.mu.Unlock()
		return zk.ErrClosing
	}
	s.calls.Add(1)
	s.mu.Unlock()
	if ctx.Done() == nil {
		defer s.calls.Done()
		return f()
	}
	var (
		mu        sync.Mutex
		abandoned bool
	)
	done := make(chan error, 1)
	go func() {
		defer s.calls.Done()
		err := f()
		mu.Lock()
		if !abandoned {
			done <- err
			mu.Unlock()
			return
		}
		mu.Unlock()
		if late != nil {
			late(err)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case err := <-done:
			return err
		default:
		}
		abandoned = true
		return ctx.Err()
	}
}

// transient reports whether err is connection or session trouble that a
// retry may get past.
func transient(err error) bool {
	return inDoubt(err) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrSessionMoved) ||
		errors.Is(err, errNoSession)
}

// inDoubt reports whether err leaves a request's outcome unknown: the
// connection failed with the request sent, or perhaps sent. go-zookeeper
// reports zk.ErrConnectionClosed for requests in flight when a connection
// ends, and the socket's own error when writing the request failed. Errors
// the server answered with, and zk.ErrNoServer (requests that never left),
// are not in doubt.
func inDoubt(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // context.DeadlineExceeded is a net.Error too
	}
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// backoff is the driver's delay between retries: internal/backoff's, from
// 10ms to 1s. Its zero value is ready (the driver's loops declare it and
// reset it with backoff{}).
type backoff struct{ b ibackoff.Backoff }

// sleep waits for the next delay; it returns false if ctx ended first. It
// also returns early when wake (if not nil) is closed.
func (b *backoff) sleep(ctx context.Context, wake <-chan struct{}) bool {
	if b.b.Max == 0 {
		b.b = ibackoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	}
	t := time.NewTimer(b.b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C:
	}
	return true
}

// hostProvider is go-zookeeper's zk.HostProvider without its pause on the
// first reconnect: zk.DNSHostProvider reports a full retry (which makes the
// connection wait a second) as soon as it comes back to the last server that
// worked, so that with one server every reconnect waited 1s, longer than a
// short session lives. This one waits only after every server failed once.
type hostProvider struct {
	mu       sync.Mutex
	servers  []string
	next     int
	attempts int // since the last successful connection
}

func (p *hostProvider) Init(servers []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.servers = slices.Clone(servers)
	rand.Shuffle(len(p.servers), func(i, j int) { p.servers[i], p.servers[j] = p.servers[j], p.servers[i] })
	return nil
}

func (p *hostProvider) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.servers)
}

func (p *hostProvider) Next() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	srv := p.servers[p.next]
	p.next = (p.next + 1) % len(p.servers)
	p.attempts++
	retry := p.attempts > len(p.servers)
	if retry {
		p.attempts = 1
	}
	return srv, retry
}

func (p *hostProvider) Connected() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts = 0
}

// sniffConn is a socket of an owned session. It reads the session ID and
// the negotiated timeout off the connect response, the first frame the
// server sends: length, protocol version, timeout (ms), session ID, all big
// endian. go-zookeeper keeps the negotiated timeout to itself, and counts a
// connect answered with "session expired" as a failed one.
type sniffConn struct {
	net.Conn
	s     *session
	hdr   [20]byte
	n     int
	wrote bool // a frame was written (Write runs in one goroutine at a time)
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n < len(c.hdr) && n > 0 {
		c.n += copy(c.hdr[c.n:], p[:n])
		if c.n == len(c.hdr) {
			c.s.mu.Lock()
			c.s.handshake.timeout = int32(binary.BigEndian.Uint32(c.hdr[8:12]))
			c.s.handshake.sid = int64(binary.BigEndian.Uint64(c.hdr[12:20]))
			c.s.mu.Unlock()
			// The server answered, if only to say that the session expired: the
			// next connection (for a new session) need not wait.
			c.s.hosts.Connected()
		}
	}
	return n, err
}

// Write sends a frame of go-zookeeper's (one per call: the connect
// request, then length, xid, opcode, body); once its SetWatches request is
// written, the session's calls may go (see settle).
func (c *sniffConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	first := !c.wrote // the connect request: no opcode
	c.wrote = true
	if err == nil && !first && len(p) >= 12 && int32(binary.BigEndian.Uint32(p[8:12])) == opSetWatches {
		c.s.mu.Lock()
		c.s.settle()
		c.s.mu.Unlock()
	}
	return n, err
}

func (c *sniffConn) Close() error {
	c.s.socks.remove(c)
	return c.Conn.Close()
}

// socketSet tracks the open sockets of an owned session, so that close can
// cut them even while go-zookeeper waits on one (a connect attempt into a
// partition waits ten read timeouts for its answer).
type socketSet struct {
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

func (ss *socketSet) add(c net.Conn) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	if ss.open == nil {
		ss.open = map[net.Conn]struct{}{}
	}
	ss.open[c] = struct{}{}
	return true
}

func (ss *socketSet) remove(c net.Conn) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.open, c)
}

func (ss *socketSet) closeAll() {
	ss.mu.Lock()
	ss.closed = true
	open := ss.open
	ss.open = nil
	ss.mu.Unlock()
	for c := range open {
		_ = c.(*sniffConn).Conn.Close()
	}
}

// maxFlights bounds the grouped requests (see multi) in flight at once on
// a session.
const maxFlights = 4

// maxGroupOps and maxGroupData bound the operations of one grouped
// multi-op and the data they carry (ZooKeeper refuses packets over 1MB).
const (
	maxGroupOps  = 128
	maxGroupData = 256 << 10
)

// groupOp is one caller's operations waiting in a session's queue (see
// multi).
type groupOp struct {
	reqs []any // *zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest
	data int   // bytes of data in reqs
	res  []zk.MultiResponse
	err  error
	done chan struct{}
}

// multi runs reqs as one multi-op, as conn.Multi does (a lone delete as a
// plain delete), but the operations of callers that come while requests
// are in flight on the session go together in the next multi-op (group
// commit): a ZooKeeper request costs the server far more than an
// operation in it, so thousands of concurrent acquisitions or releases
// take a few hundred requests. A caller alone goes at once. When one
// caller's operation fails the multi-op, that caller gets the failure and
// the others are sent again without it, so that each caller's operations
// are applied, or not, together and alone, and fail with their own error.
func (s *session) multi(reqs ...any) ([]zk.MultiResponse, error) {
	op := &groupOp{reqs: reqs, done: make(chan struct{})}
	for _, r := range reqs {
		switch r := r.(type) {
		case *zk.CreateRequest:
			op.data += len(r.Data) + len(r.Path)
		case *zk.SetDataRequest:
			op.data += len(r.Data) + len(r.Path)
		case *zk.DeleteRequest:
			op.data += len(r.Path)
		}
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil, zk.ErrClosing
	}
	s.queued = append(s.queued, op)
	if s.flights < maxFlights {
		s.flights++
		s.calls.Add(1)
		go s.flush()
	}
	s.mu.Unlock()
	<-op.done
	return op.res, op.err
}

// deleteNode deletes the node at path with version (see multi).
func (s *session) deleteNode(path string, version int32) error {
	_, err := s.multi(&zk.DeleteRequest{Path: path, Version: version})
	return err
}

// flush sends the queued operations until none is left.
func (s *session) flush() {
	defer s.calls.Done()
	for {
		s.mu.Lock()
		n, ops, data := 0, 0, 0
		for n < len(s.queued) {
			op := s.queued[n]
			if n > 0 && (ops+len(op.reqs) > maxGroupOps || data+op.data > maxGroupData) {
				break
			}
			n++
			ops += len(op.reqs)
			data += op.data
		}
		batch := s.queued[:n:n]
		s.queued = s.queued[n:]
		if n == 0 {
			s.queued = nil
			s.flights--
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.send(batch)
	}
}

// send runs batch's operations and closes their done channels.
func (s *session) send(batch []*groupOp) {
	defer func() {
		for _, op := range batch {
			close(op.done)
		}
	}()
	for left := batch; len(left) > 0; {
		if len(left) == 1 {
			op := left[0]
			if d, ok := op.reqs[0].(*zk.DeleteRequest); ok && len(op.reqs) == 1 {
				op.err = s.conn.Delete(d.Path, d.Version)
				return
			}
			op.res, op.err = s.conn.Multi(op.reqs...)
			return
		}
		var reqs []any
		for _, op := range left {
			reqs = append(reqs, op.reqs...)
		}
		res, err := s.conn.Multi(reqs...)
		failed := -1 // the operation that failed the multi-op: the first with an error
		for i, r := range res {
			if r.Error != nil {
				failed = i
				break
			}
		}
		if failed < 0 {
			// Done, or in doubt, or not sent: for each alike.
			for _, op := range left {
				op.err = err
				if err == nil && len(res) >= len(op.reqs) {
					op.res, res = res[:len(op.reqs):len(op.reqs)], res[len(op.reqs):]
				}
			}
			return
		}
		if err == nil {
			err = res[failed].Error // not seen: the reply carries its first op's error
		}
		// The failing caller gets the error; the others were rolled back,
		// and go again without it.
		if failed >= len(reqs) {
			for _, op := range left {
				op.err = err
			}
			return
		}
		for i, op := range left {
			if failed < len(op.reqs) {
				op.err = err
				left = append(left[:i:i], left[i+1:]...)
				break
			}
			failed -= len(op.reqs)
		}
	}
}
