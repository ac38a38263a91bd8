package zookeeper

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
)

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
