package zookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// connect returns a Locker on addr, closed at cleanup.
func connect(t testing.TB, addr string, o *zookeeper.Options) *dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, []string{addr}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func withTTL(ttl time.Duration) *zookeeper.Options {
	return &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}}
}

// result is the outcome of an Acquire run in the background.
type result struct {
	ls  *dlock.Lease
	err error
}

func acquireAsync(ctx context.Context, l *dlock.Locker, name string) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, nil)
		c <- result{ls, err}
	}()
	return c
}

// waitQueue waits until the name's node has n lock nodes.
func waitQueue(t *testing.T, raw *zk.Conn, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		children, _, err := raw.Children(zookeeper.LockPath("", name))
		if err == nil && len(children) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q: got %v (%v), want %d nodes", name, children, err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// granted waits for a background Acquire.
func granted(t *testing.T, c <-chan result, within time.Duration, who string) *dlock.Lease {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v", who, r.err)
		}
		return r.ls
	case <-time.After(within):
		t.Fatalf("%s not granted within %v", who, within)
	}
	return nil
}

// notGranted checks that a background Acquire is still waiting.
func notGranted(t *testing.T, c <-chan result, who string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s returned while it should wait: %v, %v", who, r.ls, r.err)
	default:
	}
}

func release(t *testing.T, ls *dlock.Lease) {
	t.Helper()
	if err := ls.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", ls.Name(), err)
	}
}

// TestServerRestart: the server is killed and started again while a lease is
// held and a waiter waits. The session survives (ZooKeeper keeps sessions on
// disk and restarts their timeout), so the lease is not lost, the waiter keeps
// its place, and the release hands the lock to it.
func TestServerRestart(t *testing.T) {
	srv := servers.RequireNewWith(t, servers.ZooKeeper, fastConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ttl := 15 * time.Second // longer than a restart takes
	holder := connect(t, srv.Addr(), withTTL(ttl))
	waiter := connect(t, srv.Addr(), withTTL(ttl))
	other := connect(t, srv.Addr(), withTTL(ttl))
	name := "restart-" + randomHex(4)

	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	fence, _ := ls.Fence()
	wc := acquireAsync(ctx, waiter, name)
	raw := rawConn(t, srv.Addr(), ttl)
	waitQueue(t, raw, name, 2)

	began := time.Now()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("server restarted in %v", time.Since(began))

	// Once reconnected, the lease's node is still there in its session.
	for {
		ok, err := ls.Held(ctx)
		if err == nil {
			if !ok {
				t.Fatalf("lease lost across the restart: %v", ls.Err())
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Held kept failing after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ls.Refresh(ctx, 0); err != nil {
		t.Fatalf("Refresh after the restart: %v", err)
	}
	if _, err := other.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held after the restart: got %v, want ErrNotAcquired", err)
	}
	notGranted(t, wc, "waiter")
	waitQueue(t, raw, name, 2)

	release(t, ls)
	lw := granted(t, wc, 10*time.Second, "waiter")
	if f, _ := lw.Fence(); f <= fence {
		t.Fatalf("waiter's fence %d not above the holder's %d", f, fence)
	}
	release(t, lw)
}

// TestSessionKilled: the holder's session is closed on the server from
// elsewhere (as when the server expires it). The lease reports the loss as
// soon as the driver hears of it, long before its ValidUntil;
// go-zookeeper then opens a new session on the same connection, and the old
// lease is never reported held again. The waiters are granted in their order,
// and the holder's Locker queues again behind them.
func TestSessionKilled(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttl := 20 * time.Second
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	var hs handshakes
	holder := connect(t, p.Addr(), &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}, Dialer: hs.dial})
	w1 := connect(t, srv.Addr(), withTTL(ttl))
	w2 := connect(t, srv.Addr(), withTTL(ttl))
	raw := rawConn(t, srv.Addr(), ttl)
	name := "killed-" + randomHex(4)

	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c1 := acquireAsync(ctx, w1, name)
	waitQueue(t, raw, name, 2)
	c2 := acquireAsync(ctx, w2, name)
	waitQueue(t, raw, name, 3)

	// The holder reconnects at once when the server drops its connection
	// (as it does when another connection takes the session over), and would
	// take the session back from killSession: cut it off meanwhile.
	p.Blackhole()
	killSession(t, srv.Addr(), hs.session(t, ttl))
	p.Heal()
	p.Reset()
	select {
	case <-ls.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("loss not reported within 10s of the session's end")
	}
	if left := time.Until(ls.ValidUntil()); left < ttl/2 {
		t.Errorf("loss reported only %v before ValidUntil; want it from the session, well before", left)
	}
	if !errors.Is(ls.Err(), dlock.ErrLost) {
		t.Errorf("Err() = %v, want ErrLost", ls.Err())
	}

	l1 := granted(t, c1, 10*time.Second, "first waiter")
	notGranted(t, c2, "second waiter")

	// The old lease stays lost on the holder's new session.
	if ok, err := ls.Held(ctx); ok || err != nil {
		t.Errorf("Held after the session ended = %v, %v; want false, nil", ok, err)
	}
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release after the session ended: got %v, want ErrNotHeld", err)
	}
	// The holder's Locker works on its new session and queues behind w2.
	ch := acquireAsync(ctx, holder, name)
	waitQueue(t, raw, name, 3)

	release(t, l1)
	l2 := granted(t, c2, 10*time.Second, "second waiter")
	notGranted(t, ch, "holder, queued again")
	release(t, l2)
	lh := granted(t, ch, 10*time.Second, "holder, queued again")
	release(t, lh)
}

// TestPartitionedHolder: a holder cut off from the server loses its lease at
// its ValidUntil; the first waiter is granted only after that (once the
// server expired the session), the second keeps its place; after the
// partition heals the holder's Locker finds its old session expired and
// reports the old lease not held.
func TestPartitionedHolder(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttl := time.Second
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	holder := connect(t, p.Addr(), withTTL(ttl))
	w1 := connect(t, srv.Addr(), withTTL(ttl))
	w2 := connect(t, srv.Addr(), withTTL(ttl))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "partition-" + randomHex(4)

	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c1 := acquireAsync(ctx, w1, name)
	waitQueue(t, raw, name, 2)
	c2 := acquireAsync(ctx, w2, name)
	waitQueue(t, raw, name, 3)

	p.Blackhole()
	select {
	case <-ls.Done():
	case <-time.After(3 * ttl):
		t.Fatal("partitioned holder's lease did not end")
	}
	if late := time.Since(ls.ValidUntil()); late > 50*time.Millisecond {
		t.Errorf("loss signalled %v after ValidUntil", late)
	}
	until := ls.ValidUntil()
	l1 := granted(t, c1, 5*ttl, "first waiter")
	if time.Now().Before(until) {
		t.Fatal("first waiter granted before the holder's ValidUntil")
	}
	notGranted(t, c2, "second waiter")

	p.Heal()
	if ok, err := ls.Held(ctx); ok || err != nil {
		t.Errorf("Held after the partition = %v, %v; want false, nil", ok, err)
	}
	release(t, l1)
	l2 := granted(t, c2, 5*ttl, "second waiter")
	release(t, l2)
	// The holder's Locker carries on with a new session.
	lh, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("Acquire after the partition healed: %v", err)
	}
	release(t, lh)
}

// handshakes records the sessions a dialer's connections were given: what
// a test needs to close a session from elsewhere.
type handshakes struct {
	mu   sync.Mutex
	seen []handshake
}

type handshake struct {
	sid     int64
	timeout time.Duration
	passwd  []byte
}

func (hs *handshakes) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &recordConn{Conn: c, hs: hs}, nil
}

// session returns the last session established with the given timeout.
func (hs *handshakes) session(t *testing.T, timeout time.Duration) handshake {
	t.Helper()
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for i := len(hs.seen) - 1; i >= 0; i-- {
		if h := hs.seen[i]; h.timeout == timeout && h.sid != 0 {
			return h
		}
	}
	t.Fatalf("no session with timeout %v among %d", timeout, len(hs.seen))
	return handshake{}
}

// recordConn reads the connect response: length, protocol version, timeout,
// session ID, password (length-prefixed).
type recordConn struct {
	net.Conn
	hs   *handshakes
	buf  []byte
	done bool
}

func (c *recordConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.buf = append(c.buf, p[:n]...)
		if len(c.buf) >= 24 {
			pwLen := int(binary.BigEndian.Uint32(c.buf[20:24]))
			if len(c.buf) >= 24+pwLen {
				c.done = true
				c.hs.mu.Lock()
				c.hs.seen = append(c.hs.seen, handshake{
					timeout: time.Duration(binary.BigEndian.Uint32(c.buf[8:12])) * time.Millisecond,
					sid:     int64(binary.BigEndian.Uint64(c.buf[12:20])),
					passwd:  append([]byte(nil), c.buf[24:24+pwLen]...),
				})
				c.hs.mu.Unlock()
			}
		}
	}
	return n, err
}

// killSession closes a session on the server from a connection of its own,
// the way Curator's tests kill one: connect with its ID and password, then
// send closeSession. The server deletes its ephemeral nodes and drops its
// other connection; the session's owner learns it has expired.
func killSession(t *testing.T, addr string, h handshake) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// ConnectRequest: protocol version, last zxid seen, timeout, session ID,
	// password.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(h.timeout/time.Millisecond))
	req = binary.BigEndian.AppendUint64(req, uint64(h.sid))
	req = binary.BigEndian.AppendUint32(req, uint32(len(h.passwd)))
	req = append(req, h.passwd...)
	if err := writeFrame(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := readFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	if sid := int64(binary.BigEndian.Uint64(resp[8:16])); sid != h.sid {
		t.Fatalf("reattaching to session %#x: server answered with session %#x", h.sid, sid)
	}
	// closeSession: xid 1, opcode -11.
	closeReq := binary.BigEndian.AppendUint32(nil, 1)
	closeReq = binary.BigEndian.AppendUint32(closeReq, uint32(0xffffffff-10))
	if err := writeFrame(c, closeReq); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(c); err != nil {
		t.Fatal(err)
	}
}

func writeFrame(w io.Writer, body []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err := io.ReadFull(r, body)
	return body, err
}
