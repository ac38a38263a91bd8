package zookeeper_test

import (
	"bufio"
	"context"
	"errors"
	"github.com/dlock/dlock/internal/testexport/zookeeperexport"
	"github.com/dlock/dlock/tests/internal/testutil"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// TestTTLNegotiation: the lease's TTL is the session timeout the server
// granted; a TTL outside the server's range is rejected with ErrInvalid (the
// second time before any I/O).
func TestTTLNegotiation(t *testing.T) {
	srv := zkServer(t)
	ctx := context.Background()
	l := connect(t, srv.Addr(), nil)
	name := "ttl-" + testutil.RandomHex(4)
	ls, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: 1234 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := ls.TTL(); got != 1234*time.Millisecond {
		t.Errorf("TTL() = %v, want 1.234s", got)
	}
	release(t, ls)
	for i := range 2 {
		_, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: 2 * time.Minute})
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "maximum session timeout 1m0s") {
			t.Errorf("try %d: TTL above the server's maximum: got %v, want ErrInvalid naming 1m0s", i, err)
		}
	}
	if _, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: 99 * time.Millisecond}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("TTL below MinTTL: got %v, want ErrInvalid", err)
	}
}

// TestRefreshMovesSession: a Refresh with another TTL moves the node into a
// session with that timeout, keeping its name (its place in the queue) and
// the fencing token; the waiter behind it keeps waiting and is granted on
// release.
func TestRefreshMovesSession(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	holder := connect(t, srv.Addr(), withTTL(time.Second))
	waiter := connect(t, srv.Addr(), withTTL(time.Second))
	name := "move-" + testutil.RandomHex(4)
	path := zookeeper.LockPath("", name)

	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	fence, _ := ls.Fence()
	c := acquireAsync(ctx, waiter, name)
	waitQueue(t, raw, name, 2)
	before, _, _ := raw.Children(path)
	slices.Sort(before) // the server lists children in no particular order
	owner := func() int64 {
		t.Helper()
		children, _, err := raw.Children(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range children {
			if strings.Contains(ch, ls.Token()) {
				_, st, err := raw.Exists(path + "/" + ch)
				if err != nil {
					t.Fatal(err)
				}
				return st.EphemeralOwner
			}
		}
		t.Fatalf("no node of the lease among %v", children)
		return 0
	}
	first := owner()

	// Not below 1s: a session times out with the TTL, and go-zookeeper drops
	// a connection whose pings go unanswered for two thirds of it; at 700ms
	// a loaded machine lost the lease in the 1.5s below (busy run 11).
	for _, ttl := range []time.Duration{3 * time.Second, 1500 * time.Millisecond} {
		if err := ls.Refresh(ctx, ttl); err != nil {
			t.Fatalf("Refresh(%v): %v", ttl, err)
		}
		if got := ls.TTL(); got != ttl {
			t.Errorf("TTL() after Refresh(%v) = %v", ttl, got)
		}
		if o := owner(); o == first {
			t.Errorf("Refresh(%v): the node is still in the first session", ttl)
		}
		after, _, _ := raw.Children(path)
		slices.Sort(after)
		if strings.Join(after, ",") != strings.Join(before, ",") {
			t.Errorf("Refresh(%v): queue %v became %v", ttl, before, after)
		}
		if f, _ := ls.Fence(); f != fence {
			t.Errorf("fence changed from %d to %d", fence, f)
		}
		// The waiter watches the node, which the move deletes and creates
		// again: it must not take that for a release (see firstNow). Its
		// watch event comes on its own connection, a moment after the
		// move's reply: give it that moment.
		select {
		case r := <-c:
			t.Fatalf("Refresh(%v): the waiter returned (error %v) while the lease is held", ttl, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		if ok, err := ls.Held(ctx); !ok || err != nil {
			t.Fatalf("Held after Refresh(%v) = %v, %v", ttl, ok, err)
		}
	}
	// The watchdog carries on at the new TTL: still held past the first TTLs.
	time.Sleep(2 * time.Second)
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held 2s later = %v, %v (%v)", ok, err, ls.Err())
	}
	// A TTL the server cannot honour leaves the lease as it was.
	if err := ls.Refresh(ctx, 2*time.Minute); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Refresh(2m): got %v, want ErrInvalid", err)
	}
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held after a refused Refresh = %v, %v", ok, err)
	}
	release(t, ls)
	lw := granted(t, c, 5*time.Second, "waiter")
	if f, _ := lw.Fence(); f <= fence {
		t.Errorf("waiter's fence %d not above %d", f, fence)
	}
	release(t, lw)
}

// TestWaiterNodeDeleted: someone deletes the first waiter's node while it
// waits; when the holder releases, the waiter is not granted on its old node
// (gone) but queues again, and holds a node of its own.
func TestWaiterNodeDeleted(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	holder := connect(t, srv.Addr(), withTTL(2*time.Second))
	waiter := connect(t, srv.Addr(), withTTL(2*time.Second))
	name := "waiter-deleted-" + testutil.RandomHex(4)
	path := zookeeper.LockPath("", name)

	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := acquireAsync(ctx, waiter, name)
	waitQueue(t, raw, name, 2)
	children, _, err := raw.Children(path)
	if err != nil {
		t.Fatal(err)
	}
	var waiting string
	for _, ch := range children {
		if !strings.Contains(ch, ls.Token()) {
			waiting = ch
		}
	}
	// Let the waiter set its watches (on the holder's node and its own)
	// before its node goes.
	time.Sleep(200 * time.Millisecond)
	if err := raw.Delete(path+"/"+waiting, -1); err != nil {
		t.Fatal(err)
	}
	waitQueue(t, raw, name, 1)
	release(t, ls)
	lw := granted(t, c, 5*time.Second, "waiter")
	if ok, err := lw.Held(ctx); !ok || err != nil {
		t.Fatalf("the waiter's lease: Held = %v, %v (granted on its deleted node)", ok, err)
	}
	children, _, _ = raw.Children(path)
	if len(children) != 1 || children[0] == waiting || !strings.Contains(children[0], lw.Token()) {
		t.Errorf("queue %v: want one node of the waiter's, not %s", children, waiting)
	}
	release(t, lw)
}

// TestContainersVanish: the name nodes are containers, which the server
// deletes once empty (the test server checks every 100ms), so distinct names
// do not pile up.
func TestContainersVanish(t *testing.T) {
	srv := zkServer(t)
	ctx := context.Background()
	l := connect(t, srv.Addr(), withTTL(time.Second))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	var names []string
	for range 5 {
		n := "vanish-" + testutil.RandomHex(4)
		names = append(names, n)
		ls, err := l.TryAcquire(ctx, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		release(t, ls)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range names {
		for {
			ok, _, err := raw.Exists(zookeeper.LockPath("", n))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still exists 10s after its last lock", zookeeper.LockPath("", n))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestIdleSessionsClose: a session left without leases or waiters closes
// after a while; the next lock with that TTL opens a new one.
func TestIdleSessionsClose(t *testing.T) {
	t.Cleanup(zookeeperexport.SetIdleAfter(200 * time.Millisecond))
	srv := zkServer(t)
	ctx := context.Background()
	base := connections(t, srv.Addr())
	l := connect(t, srv.Addr(), nil)
	var leases []*dlock.Lease
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		ls, err := l.TryAcquire(ctx, "idle-"+testutil.RandomHex(4), &dlock.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, ls)
	}
	// The probe session Connect opened may still be closing.
	deadline := time.Now().Add(10 * time.Second)
	for n := connections(t, srv.Addr()); n != base+3; n = connections(t, srv.Addr()) {
		if time.Now().After(deadline) {
			t.Fatalf("with 3 TTLs in use: %d connections, want %d", n, base+3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, ls := range leases {
		release(t, ls)
	}
	for connections(t, srv.Addr()) != base {
		if time.Now().After(deadline) {
			t.Fatalf("idle sessions still open: %d connections, want %d", connections(t, srv.Addr()), base)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ls, err := l.TryAcquire(ctx, "idle-again", &dlock.Options{TTL: time.Second})
	if err != nil {
		t.Fatalf("TryAcquire after the sessions closed: %v", err)
	}
	release(t, ls)
}

// connections asks the server (mntr) how many client connections it has.
func connections(t *testing.T, addr string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("mntr")); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "zk_num_alive_connections\t"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n - 1 // this one
		}
	}
	t.Fatalf("mntr without zk_num_alive_connections: %v", sc.Err())
	return 0
}

// TestNew: a Locker on the application's connection. Its TTLs cannot exceed
// the session timeout; a lease that is not refreshed has its node deleted by
// the driver after its TTL although the session lives on.
func TestNew(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := rawConn(t, srv.Addr(), 10*time.Second)
	if _, err := zookeeper.New(nil, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New(nil): got %v, want ErrInvalid", err)
	}
	if _, err := zookeeper.New(conn, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New without SessionTimeout: got %v, want ErrInvalid", err)
	}
	l, err := zookeeper.New(conn, &zookeeper.Options{SessionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	other := connect(t, srv.Addr(), withTTL(time.Second))
	name := "new-" + testutil.RandomHex(4)

	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 10*time.Second {
		t.Errorf("default TTL = %v, want the session timeout", ls.TTL())
	}
	if _, err := other.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("contender: got %v, want ErrNotAcquired", err)
	}
	if err := ls.Refresh(ctx, 20*time.Second); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Refresh above the session timeout: got %v, want ErrInvalid", err)
	}
	release(t, ls)
	if _, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: 20 * time.Second}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("TTL above the session timeout: got %v, want ErrInvalid", err)
	}

	// Not refreshed: gone from the server soon after its TTL.
	short, err := l.Acquire(ctx, name, &dlock.Options{TTL: 500 * time.Millisecond, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	c := acquireAsync(ctx, other, name)
	<-short.Done()
	lo := granted(t, c, 2*time.Second, "contender after the unrefreshed lease's TTL")
	release(t, lo)
	if err := short.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of the expired lease: got %v, want ErrNotHeld", err)
	}

	// Close releases what is held; the connection stays the application's.
	held, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(held.Err(), dlock.ErrNotHeld) {
		t.Errorf("lease after Close: %v", held.Err())
	}
	if _, _, err := conn.Children("/"); err != nil {
		t.Errorf("the application's connection after Close: %v", err)
	}
	lo, err = other.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("TryAcquire after Close released the lock: %v", err)
	}
	release(t, lo)
}

// TestResetStorm: two lockers take turns on one name while one's
// connections are reset every few milliseconds, so that creates, deletes and
// listings lose their replies. Leases never overlap, every failure is a
// plain error (no hang), and no node is left behind: creates whose reply was
// lost are found again by their GUID.
func TestResetStorm(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := faultnet.ListenT(t, srv.Addr())
	ttl := 2 * time.Second
	lockers := []*dlock.Locker{connect(t, p.Addr(), withTTL(ttl)), connect(t, srv.Addr(), withTTL(ttl))}
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "storm-" + testutil.RandomHex(4)

	stop := make(chan struct{})
	var resets sync.WaitGroup
	resets.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Millisecond):
				p.Reset()
			}
		}
	})
	var (
		inside, grants, failures atomic.Int64
		wg                       sync.WaitGroup
	)
	end := time.Now().Add(2 * time.Second)
	for _, l := range lockers {
		wg.Go(func() {
			for time.Now().Before(end) {
				actx, cancel := context.WithTimeout(ctx, 3*time.Second)
				ls, err := l.Acquire(actx, name, nil)
				cancel()
				if err != nil {
					failures.Add(1)
					continue
				}
				grants.Add(1)
				if inside.Add(1) != 1 {
					t.Error("two holders at once")
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if time.Now().After(ls.ValidUntil()) {
					t.Error("held past ValidUntil")
				}
				if err := ls.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
					failures.Add(1) // a lost reply: the lease stays valid until ValidUntil
					<-ls.Done()
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	resets.Wait()
	t.Logf("%d grants, %d failed calls", grants.Load(), failures.Load())
	if grants.Load() == 0 {
		t.Fatal("no grant at all")
	}
	deadline := time.Now().Add(2*ttl + time.Second)
	for {
		children, _, err := raw.Children(zookeeper.LockPath("", name))
		if errors.Is(err, zk.ErrNoNode) || err == nil && len(children) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v, %v", children, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
