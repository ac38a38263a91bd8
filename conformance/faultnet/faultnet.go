// Package faultnet is a small in-process TCP proxy that injects real network
// faults between one lock client and a real server.
//
// The conformance suite puts a Proxy in front of the server for each locker it
// creates, so every locker has its own fault-injectable connection path: a
// fault on one locker's path leaves the others, and the server, untouched.
// A Proxy listens on 127.0.0.1, and forwards every connection it accepts to its
// target over a fresh connection of its own. The client dials [Proxy.Addr]
// instead of the server.
//
// Faults, and what each models:
//
//   - [Proxy.Blackhole] is a silent network partition: the locker's packets, and
//     the server's replies, vanish. Sockets stay open, nothing is closed or
//     reset, writes succeed, reads wait. New connections are accepted but never
//     reach the server. Neither side learns anything except by timing out.
//   - [Proxy.Heal] ends the partition. A connection that lost bytes during it
//     has a corrupt stream and is reset, the way a TCP connection dies when a
//     partition outlasts its retransmissions; so is one accepted during it,
//     which never reached the server. An idle one carries on.
//   - [Proxy.Reset] is a crash of the network path (a middlebox or NAT dropping
//     its state, a peer's host rebooting): every current connection is aborted
//     with a TCP RST on both sides, and the next dial works.
//   - [Proxy.SetLatency] is a slow link: every chunk of bytes arrives a fixed
//     delay after it was sent, in each direction, in order.
//
// Faults act on chunks: the bytes returned by one read on one side. Each
// chunk's fate is decided just before it is written to the other side, so a
// black hole also swallows bytes that were already inside the proxy (waiting
// out a latency) when it began. A write already under way when a fault is
// injected completes, as bytes already on the wire would.
//
// A Proxy is safe for concurrent use. Close stops it and waits for every
// goroutine it started.
package faultnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// chunkSize is the largest chunk one read takes off a socket.
	chunkSize = 32 << 10
	// queueLen bounds the chunks held per direction of a connection (so at most
	// queueLen*chunkSize bytes); when it is full the reader waits, which pushes
	// back on the sender through TCP flow control.
	queueLen = 64
	// dialTimeout bounds dialling the target for one accepted connection.
	dialTimeout = 10 * time.Second
)

// A Proxy forwards TCP connections from Addr to a target address and injects
// faults into them. Create one with [Listen]; release it with [Proxy.Close].
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close; bounds dials and accept back-off
	cancel context.CancelFunc

	latency atomic.Int64 // time.Duration applied to chunks read from now on
	sent    atomic.Int64 // bytes read from clients, see Sent

	mu         sync.Mutex
	links      map[*link]struct{} // open connections; a link leaves it when killed or done
	blackholed bool
	closed     bool

	wg        sync.WaitGroup // the accept loop and every connection's goroutines
	closeOnce sync.Once
	closeErr  error
}

// A link is one proxied connection: the client's socket and the proxy's own
// socket to the target.
type link struct {
	client *net.TCPConn
	server *net.TCPConn // set under Proxy.mu once dialled; nil for orphans

	orphan bool // accepted during a black hole: never dialled, reset by Heal
	lossy  bool // guarded by Proxy.mu: a chunk or end of stream was dropped

	done     chan struct{} // closed by kill
	killOnce sync.Once
}

// A chunk is one read's worth of bytes on its way through the proxy.
type chunk struct {
	data []byte
	due  time.Time // earliest time it may be written
	err  error     // set on a direction's last chunk: io.EOF or the read error
}

// Listen starts a proxy on 127.0.0.1:0 forwarding every accepted connection
// to target (host:port). The target is dialled once per accepted connection,
// not by Listen, so it need not be up yet.
func Listen(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultnet: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		links:  make(map[*link]struct{}),
	}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr returns the address, 127.0.0.1:port, that clients dial instead of the
// target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole starts a silent partition. From now on bytes in both directions,
// and the ends of streams, are read and dropped; sockets stay open. New
// connections are still accepted, and black-holed too: they never reach the
// target, even after Heal. Calling Blackhole during a black hole does nothing.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackholed = true
}

// Heal ends a black hole. Connections that lost bytes, and those accepted
// during the black hole, are reset (their streams are corrupt, or they never
// reached the target); the others carry on, and new traffic flows again.
// Calling Heal with no black hole does nothing.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackholed = false
	for l := range p.links {
		if l.lossy || l.orphan {
			l.kill(true)
			delete(p.links, l)
		}
	}
}

// Reset abruptly closes every current connection with a TCP RST to both the
// client and the target (SO_LINGER 0). New connections work as before; a
// black hole, if any, stays.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.kill(true)
		delete(p.links, l)
	}
}

// SetLatency delays every chunk read from now on by d: it is written to the
// other side d after it was read, in each direction, in order. Chunks already
// inside the proxy keep the delay they were read with, so bytes are never
// reordered. SetLatency(0) removes the delay; a negative d counts as 0.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Sent returns how many bytes the proxy has read from its clients, on every
// connection, since Listen. Once it has grown past a request's bytes, the
// request is inside the proxy with the latency it was read with, and a
// SetLatency that follows applies to later traffic only: a test can delay
// one request and nothing after it.
func (p *Proxy) Sent() int64 { return p.sent.Load() }

// Conns returns the number of currently open proxied connections: accepted,
// and neither closed by an end nor killed by a fault or Close. Reset, Heal and
// Close take the connections they kill out of the count before returning.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops the listener, closes every connection and waits for all the
// proxy's goroutines to return. It is idempotent: later calls wait for the
// first to finish and return its result.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		for l := range p.links {
			l.kill(false)
			delete(p.links, l)
		}
		p.mu.Unlock()
		p.cancel()
		if err := p.ln.Close(); err != nil {
			p.closeErr = fmt.Errorf("faultnet: %w", err)
		}
		p.wg.Wait()
	})
	return p.closeErr
}

// serve accepts connections until Close.
func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure such as running out of file descriptors:
			// back off instead of spinning.
			select {
			case <-time.After(10 * time.Millisecond):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		l := &link{
			client: c.(*net.TCPConn),
			orphan: p.blackholed,
			done:   make(chan struct{}),
		}
		p.links[l] = struct{}{}
		p.wg.Go(func() { p.handle(l) })
		p.mu.Unlock()
	}
}

// handle runs one connection until both directions end or it is killed.
func (p *Proxy) handle(l *link) {
	defer p.forget(l)
	if l.orphan {
		// Partitioned from the start: swallow what the client sends and hold
		// the socket open until Heal or Close kills the link.
		io.Copy(io.Discard, l.client)
		<-l.done
		return
	}

	var d net.Dialer
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	c, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		// The client sees its connection refused, as it would without us.
		l.kill(true)
		return
	}
	server := c.(*net.TCPConn)
	p.mu.Lock()
	select {
	case <-l.done: // killed (Reset, Close) while dialling
		p.mu.Unlock()
		server.SetLinger(0)
		server.Close()
		return
	default:
	}
	l.server = server
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { p.direction(l, l.client, l.server) })
	wg.Go(func() { p.direction(l, l.server, l.client) })
	wg.Wait()
}

// forget closes a link's sockets, if no fault has yet, and takes it out of
// the count.
func (p *Proxy) forget(l *link) {
	l.kill(false)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// kill closes both sockets of l, with an RST if rst, and stops its
// goroutines. Only the first call has an effect.
func (l *link) kill(rst bool) {
	l.killOnce.Do(func() {
		close(l.done)
		for _, c := range []*net.TCPConn{l.client, l.server} {
			if c == nil {
				continue
			}
			if rst {
				c.SetLinger(0)
			}
			c.Close()
		}
	})
}

// direction forwards src to dst: a reader goroutine queues chunks, and this
// goroutine writes them, each when it falls due and only if not black-holed.
func (p *Proxy) direction(l *link, src, dst *net.TCPConn) {
	q := make(chan chunk, queueLen)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.read(l, src, q) })

	var timer *time.Timer
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.done:
			return
		}
		if wait := time.Until(c.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-l.done:
				timer.Stop()
				return
			}
		}
		if p.drop(l) {
			if c.err != nil {
				// The end of the stream is lost too: keep dst open, as
				// a partition would, until Heal or Close kills the link.
				<-l.done
				return
			}
			continue
		}
		switch {
		case errors.Is(c.err, io.EOF):
			dst.CloseWrite() // pass on the half-close
			return
		case c.err != nil:
			l.kill(true) // src failed (typically reset): reset dst too
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.kill(true)
			return
		}
	}
}

// read queues what it reads from src, stamped with its due time, ending with
// a chunk carrying the read error.
func (p *Proxy) read(l *link, src *net.TCPConn, q chan<- chunk) {
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		due := time.Now().Add(time.Duration(p.latency.Load()))
		if n > 0 && src == l.client {
			p.sent.Add(int64(n)) // after due is fixed: see Sent
		}
		if n > 0 {
			select {
			case q <- chunk{data: bytes.Clone(buf[:n]), due: due}:
			case <-l.done:
				return
			}
		}
		if err != nil {
			select {
			case q <- chunk{due: due, err: err}:
			case <-l.done:
			}
			return
		}
	}
}

// drop reports whether a chunk of l about to be written must be dropped
// instead, marking l lossy if so. Deciding and marking under one lock means
// Heal either sees the loss or comes before it.
func (p *Proxy) drop(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackholed {
		l.lossy = true
	}
	return p.blackholed
}
