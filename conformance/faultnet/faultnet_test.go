package faultnet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// patience bounds every wait for something that should happen; it is only
// reached when the proxy is broken, so it is generous.
const patience = 10 * time.Second

// quiet is how long a read waits to show that nothing arrives. An echo over
// loopback takes well under a millisecond, so a byte that leaked through a
// black hole would show up long before; a longer wait would only slow the
// tests down.
const quiet = 150 * time.Millisecond

// echoServer is the "real server": it echoes every byte back on the same
// connection.
type echoServer struct {
	ln       net.Listener
	accepted atomic.Int64
	recv     chan []byte // every chunk read, in order (dropped if nobody listens)
	ended    chan error  // one value per connection as its echo stops: nil on EOF
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{
		ln:    ln,
		recv:  make(chan []byte, 1024),
		ended: make(chan error, 1024),
	}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Go(func() { e.echo(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) echo(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			select {
			case e.recv <- bytes.Clone(buf[:n]):
			default:
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				e.end(werr)
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			e.end(err)
			return
		}
	}
}

// end reports why a connection's echo stopped, unless nobody listens.
func (e *echoServer) end(err error) {
	select {
	case e.ended <- err:
	default:
	}
}

// waitReceived waits until the server has read bytes ending in want.
func (e *echoServer) waitReceived(t *testing.T, want string) {
	t.Helper()
	var got []byte
	for !bytes.HasSuffix(got, []byte(want)) {
		select {
		case b := <-e.recv:
			got = append(got, b...)
		case <-time.After(patience):
			t.Fatalf("server got %q, want it to end in %q", got, want)
		}
	}
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }

// waitEnded waits for the next echo connection to stop and returns why.
func (e *echoServer) waitEnded(t *testing.T) error {
	t.Helper()
	select {
	case err := <-e.ended:
		return err
	case <-time.After(patience):
		t.Fatal("echo connection did not end")
		return nil
	}
}

func listen(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, patience)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(patience))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("got %q, want %q", got, msg)
	}
}

// expectSilence checks that a read on c times out: the connection is open,
// and nothing arrives.
func expectSilence(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(quiet))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read got %d bytes, err %v; want 0 bytes and a timeout", n, err)
	}
}

// expectAborted checks that a read on c fails promptly because the proxy reset
// or closed the connection, not because of the deadline.
func expectAborted(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		err = io.EOF // io.Copy reports EOF as success
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("read error %v, want a connection reset or EOF", err)
	}
}

// eventually waits for cond, which the proxy makes true asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func wantConns(t *testing.T, p *Proxy, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("Conns() == %d", n), func() bool { return p.Conns() == n })
}

// lossy counts the proxy's connections that have dropped bytes.
func lossy(p *Proxy) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.lossy {
			n++
		}
	}
	return n
}

// TestForward proves bytes flow both ways, in bulk, with a half-close passed on.
func TestForward(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	c := dial(t, p.Addr())

	roundTrip(t, c, "hello")
	roundTrip(t, c, "world")
	if got := p.Conns(); got != 1 {
		t.Fatalf("Conns() = %d, want 1", got)
	}

	// 4 MiB is far more than the proxy's queues and the socket buffers hold,
	// so this also exercises back-pressure.
	payload := make([]byte, 4<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	c.SetReadDeadline(time.Now().Add(patience))
	got, err := io.ReadAll(c) // ends at the echo server's close, passed on
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("got %d bytes back, want the %d sent, in order", len(got), len(payload))
	}
	if err := e.waitEnded(t); err != nil {
		t.Fatalf("echo ended with %v, want a clean EOF", err)
	}
	wantConns(t, p, 0)
}

// TestBlackhole proves a black hole is silent: writes succeed, reads wait,
// nothing is closed, and new connections are accepted but get nothing.
func TestBlackhole(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")

	p.Blackhole()
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatalf("write during black hole: %v", err)
	}
	expectSilence(t, c)
	if got := p.Conns(); got != 1 {
		t.Fatalf("Conns() = %d, want 1: the connection must stay open", got)
	}

	c2 := dial(t, p.Addr())
	wantConns(t, p, 2) // accepted
	if _, err := c2.Write([]byte("hello?")); err != nil {
		t.Fatalf("write on a new connection during black hole: %v", err)
	}
	expectSilence(t, c2)
	if got := e.accepted.Load(); got != 1 {
		t.Fatalf("server accepted %d connections, want 1: a new one must not reach it", got)
	}
	expectSilence(t, c) // still open, still nothing
}

// TestBlackholeInFlight proves a black hole swallows bytes already inside the
// proxy, waiting out a latency.
func TestBlackholeInFlight(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")

	const latency = 100 * time.Millisecond
	p.SetLatency(latency)
	if _, err := c.Write([]byte("echoed")); err != nil {
		t.Fatal(err)
	}
	// Once the server has the bytes (a latency later), its echo is on its way
	// back through the proxy, where it waits another latency.
	e.waitReceived(t, "echoed")
	p.Blackhole()
	// quiet (150ms) outlasts the echo's remaining latency (<100ms), so a
	// leaked echo would arrive within the read.
	expectSilence(t, c)
	eventually(t, "the proxy to drop the echo", func() bool { return lossy(p) == 1 })
}

// TestHeal proves Heal resets the connections that lost bytes or never
// reached the server, keeps idle ones, and lets new traffic through.
func TestHeal(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	idle := dial(t, p.Addr())
	roundTrip(t, idle, "idle")
	lost := dial(t, p.Addr())
	roundTrip(t, lost, "lost")

	p.Blackhole()
	if _, err := lost.Write([]byte("dropped")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the proxy to drop the write", func() bool { return lossy(p) == 1 })
	orphan := dial(t, p.Addr())
	wantConns(t, p, 3) // the orphan is accepted during the black hole

	p.Heal()
	expectAborted(t, lost)
	expectAborted(t, orphan)
	if err := e.waitEnded(t); err == nil {
		t.Fatal("the server's side of the lossy connection ended cleanly, want a reset")
	}
	if got := p.Conns(); got != 1 {
		t.Fatalf("Conns() = %d after Heal, want 1 (the idle connection)", got)
	}
	roundTrip(t, idle, "still here")
	roundTrip(t, dial(t, p.Addr()), "new")
	if got := e.accepted.Load(); got != 3 {
		t.Fatalf("server accepted %d connections, want 3 (idle, lost, new; never the orphan)", got)
	}
}

// TestReset proves Reset aborts every connection on both sides at once, and
// new connections work.
func TestReset(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")

	p.Reset()
	if got := p.Conns(); got != 0 {
		t.Fatalf("Conns() = %d after Reset, want 0", got)
	}
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read error %v, want a connection reset", err)
	}
	if err := e.waitEnded(t); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server read error %v, want a connection reset", err)
	}
	roundTrip(t, dial(t, p.Addr()), "after")
}

// TestLatency proves each direction delays every chunk by the latency while
// pipelining them in order, and that SetLatency(0) removes it.
func TestLatency(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")

	const latency = 50 * time.Millisecond
	// The lower bounds are exact: a chunk is never written before its due
	// time. The upper bound leaves a loaded -race run 1.9s of slack.
	const slow = 2 * time.Second
	p.SetLatency(latency)

	start := time.Now()
	roundTrip(t, c, "ping")
	if rtt := time.Since(start); rtt < 2*latency || rtt >= slow {
		t.Fatalf("round trip took %v, want >= %v and < %v", rtt, 2*latency, slow)
	}

	// Many small writes: every byte comes back in order, and the whole burst
	// takes about one round trip, not one per write.
	const writes = 500
	start = time.Now()
	werr := make(chan error, 1)
	go func() {
		var b [4]byte
		for i := range writes {
			binary.BigEndian.PutUint32(b[:], uint32(i))
			if _, err := c.Write(b[:]); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	got := make([]byte, 4*writes)
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	elapsed := time.Since(start)
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	for i := range writes {
		if v := binary.BigEndian.Uint32(got[4*i:]); v != uint32(i) {
			t.Fatalf("value %d is %d: bytes reordered", i, v)
		}
	}
	if elapsed < 2*latency || elapsed >= slow {
		t.Fatalf("%d writes took %v, want >= %v and < %v", writes, elapsed, 2*latency, slow)
	}

	p.SetLatency(0)
	roundTrip(t, c, "fast again") // no timing assertion: benchmarks own speed
}

// TestClose proves Close ends every connection and goroutine, and is idempotent.
func TestClose(t *testing.T) {
	e := newEchoServer(t)
	before := goleak.IgnoreCurrent()
	p, err := Listen(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, "hi")
	p.Blackhole() // a held-open, black-holed connection must not stall Close
	orphan := dial(t, p.Addr())
	wantConns(t, p, 2)

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := p.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
	if got := p.Conns(); got != 0 {
		t.Fatalf("Conns() = %d after Close, want 0", got)
	}
	expectAborted(t, c)
	expectAborted(t, orphan)
	if c, err := net.DialTimeout("tcp", p.Addr(), patience); err == nil {
		c.Close()
		t.Fatal("dial after Close succeeded, want it refused")
	}
	e.waitEnded(t) // the server's side closes too
	goleak.VerifyNone(t, before)
}

// TestListenBadTarget proves a malformed target fails fast.
func TestListenBadTarget(t *testing.T) {
	if p, err := Listen("no-port"); err == nil {
		p.Close()
		t.Fatal("Listen(\"no-port\") succeeded, want an error")
	}
}

// TestUnreachableTarget proves a connection whose target refuses is reset,
// like a refused dial, and the proxy keeps working.
func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there now
	p := listen(t, target)
	// The reset can beat the dial's own completion check, failing the dial.
	c, err := net.DialTimeout("tcp", p.Addr(), patience)
	if err == nil {
		defer c.Close()
		expectAborted(t, c)
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("dial error %v, want none or a connection reset", err)
	}
	wantConns(t, p, 0)
}

// TestConcurrentFaults proves faults may be injected from many goroutines
// while traffic flows, without races, deadlocks or leaks (run with -race).
func TestConcurrentFaults(t *testing.T) {
	e := newEchoServer(t)
	p := listen(t, e.addr())

	stop := make(chan struct{})
	var clients sync.WaitGroup
	for range 4 {
		clients.Go(func() {
			buf := make([]byte, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), patience)
				if err != nil {
					continue
				}
				c.SetDeadline(time.Now().Add(20 * time.Millisecond))
				for i := 0; i < 5; i++ {
					if _, err := c.Write([]byte("ping")); err != nil {
						break
					}
					if _, err := c.Read(buf); err != nil {
						break
					}
				}
				c.Close()
			}
		})
	}
	var faults sync.WaitGroup
	for g := range 3 {
		faults.Go(func() {
			for i := range 100 {
				switch (g + i) % 5 {
				case 0:
					p.Blackhole()
				case 1:
					p.Heal()
				case 2:
					p.Reset()
				case 3:
					p.SetLatency(time.Duration(i%3) * time.Millisecond)
				case 4:
					p.Conns()
				}
				time.Sleep(100 * time.Microsecond) // pacing, so faults overlap traffic; nothing waits on it
			}
		})
	}
	faults.Wait()
	close(stop)
	clients.Wait()

	p.Heal()
	p.SetLatency(0)
	roundTrip(t, dial(t, p.Addr()), "still works")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
