package zookeeper_test

// Tests of the guarantee that every lock node a Locker creates is the live
// lease's, a live waiter's, or deleted: one per point where a create's
// outcome or a delete can be lost, one for the sweep on a session's
// resumption, and a randomized loop. Each ends by checking that the name's
// node holds no lock node (listed with their owner sessions otherwise) and
// that a fresh Locker is granted the lock.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testexport/zookeeperexport"
	"github.com/dlock/dlock/tests/internal/testutil"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// lockNodes lists the lock nodes under name with their owner sessions.
func lockNodes(raw *zk.Conn, name string) ([]string, error) {
	parent := zookeeper.LockPath("", name)
	children, _, err := raw.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range children {
		if !strings.Contains(c, "lock-") {
			continue
		}
		ok, st, err := raw.Exists(parent + "/" + c)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, fmt.Sprintf("%s (session %#x)", c, st.EphemeralOwner))
		}
	}
	return out, nil
}

// noResidue waits until name has no lock node left.
func noResidue(t *testing.T, raw *zk.Conn, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		nodes, err := lockNodes(raw, name)
		if err == nil && len(nodes) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after everything ended, lock nodes of %q left: %v (%v)", within, name, nodes, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeFor checks that a fresh Locker on addr is granted name within d.
func freeFor(t *testing.T, addr, name string, within time.Duration) {
	t.Helper()
	l := connect(t, addr, withTTL(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("a fresh Locker is not granted %q within %v: %v", name, within, err)
	}
	release(t, ls)
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestOrphanLostCreateReply: the reply to a create is lost (the connection
// is reset after the server made the node, with the reply held up in the
// proxy). The attempt finds its node again by its GUID after reconnecting
// instead of making a second one, and waits with it.
func TestOrphanLostCreateReply(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	l := connect(t, p.Addr(), withTTL(3*time.Second))
	holder := connect(t, srv.Addr(), withTTL(3*time.Second))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "lostreply-" + testutil.RandomHex(4)
	ls, err := l.TryAcquire(ctx, name, nil) // opens the session
	if err != nil {
		t.Fatal(err)
	}
	release(t, ls)
	lh, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Bytes take 500ms through the proxy each way: reset the connection as
	// soon as the node exists, with the reply still inside.
	p.SetLatency(500 * time.Millisecond)
	began := time.Now()
	c := acquireAsync(ctx, l, name)
	waitQueue(t, raw, name, 2)
	p.Reset()
	p.SetLatency(0)
	if d := time.Since(began); d > 900*time.Millisecond {
		t.Logf("the node showed up %v after the call: its reply may have come back first", d)
	}
	notGranted(t, c, "waiter")
	release(t, lh)
	ls = granted(t, c, 15*time.Second, "the acquisition whose create's reply was lost")
	if nodes, _ := lockNodes(raw, name); len(nodes) != 1 {
		t.Errorf("lock nodes after the grant: %v, want the lease's alone", nodes)
	}
	release(t, ls)
	noResidue(t, raw, name, 5*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

// TestOrphanCreateAcrossExpiry: an acquisition starts while its Locker
// reconnects, after the server expired its session. go-zookeeper keeps the
// requests made meanwhile (it waits a second before dialling again once
// every server failed) and sends them on the session it then gets: the
// create, made for the old session, runs in the new one. The node is the
// attempt's, not an orphan ahead of a second node the attempt would make and
// wait behind; and when the attempt was cancelled meanwhile, it is deleted.
func TestOrphanCreateAcrossExpiry(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancelled=%v", cancelled), func(t *testing.T) {
			srv, ctx, p := orphanSetup(t)
			ttl := time.Second
			var hs handshakes
			l := connect(t, p.Addr(), &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}, Dialer: hs.dial})
			// The holder's TTL is long: at 1s, on a loaded machine, its
			// session may expire during the test, and the TryAcquire below
			// is then rightly granted (busy run 27).
			holder := connect(t, srv.Addr(), withTTL(10*time.Second))
			raw := rawConn(t, srv.Addr(), 10*time.Second)
			name := "across-" + testutil.RandomHex(4)
			ls, err := l.TryAcquire(ctx, name, nil) // opens the session
			if err != nil {
				t.Fatal(err)
			}
			release(t, ls)
			sess := hs.session(t, ttl)
			lh, err := holder.Acquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}

			// Cut the connection off, wait until go-zookeeper gave up on it
			// and dials again (into the black hole), end its session, and let
			// it reconnect.
			base := p.Conns()
			p.Blackhole()
			waitFor(t, 10*time.Second, "reconnection attempt", func() bool { return p.Conns() > base })
			killSession(t, srv.Addr(), sess)
			p.Heal()
			actx, acancel := context.WithCancel(ctx)
			defer acancel()
			c := acquireAsync(actx, l, name)
			if cancelled {
				time.Sleep(200 * time.Millisecond) // the create waits in go-zookeeper's queue
				acancel()
				if r := <-c; r.err == nil {
					t.Fatal("cancelled acquisition granted")
				}
				// Another request on the session is answered after the
				// cancelled create, once the Locker has reconnected.
				waitFor(t, 10*time.Second, "TryAcquire answered busy", func() bool {
					_, err := l.TryAcquire(ctx, name, nil)
					if err == nil {
						t.Fatalf("TryAcquire granted while held (the holder's lease: %v)", lh.Err())
					}
					return errors.Is(err, dlock.ErrNotAcquired)
				})
				waitFor(t, 10*time.Second, "deletion of the cancelled create's node", func() bool {
					nodes, _ := lockNodes(raw, name)
					return len(nodes) == 1
				})
			} else {
				waitQueue(t, raw, name, 2)
				notGranted(t, c, "waiter")
			}
			release(t, lh)
			if !cancelled {
				ls := granted(t, c, 10*time.Second, "acquisition across the session's expiry")
				if nodes, _ := lockNodes(raw, name); len(nodes) != 1 {
					t.Errorf("lock nodes after the grant: %v, want the lease's alone", nodes)
				}
				release(t, ls)
			}
			noResidue(t, raw, name, 10*time.Second)
			freeFor(t, srv.Addr(), name, 10*time.Second)
		})
	}
}

// TestOrphanLostRelease: the delete of a release is lost (the connection is
// black-holed, then reset). Release fails and the lease stays valid until
// its ValidUntil, as documented; the driver deletes the node then, and the
// next Locker is granted, not before.
func TestOrphanLostRelease(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	ttl := 2 * time.Second
	l := connect(t, p.Addr(), withTTL(ttl))
	other := connect(t, srv.Addr(), withTTL(ttl))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "lostrelease-" + testutil.RandomHex(4)
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := acquireAsync(ctx, other, name)
	waitQueue(t, raw, name, 2)

	p.Blackhole()
	rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = ls.Release(rctx)
	rcancel()
	if err == nil {
		t.Fatal("Release succeeded through a black hole")
	}
	p.Heal() // resets the connection: the delete fails with zk: connection closed
	lo := granted(t, c, 3*ttl, "waiter after the failed release")
	if until := ls.ValidUntil(); time.Now().Before(until) {
		t.Errorf("waiter granted %v before the holder's ValidUntil", time.Until(until))
	}
	release(t, lo)
	noResidue(t, raw, name, 5*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

// TestOrphanLostLeave: a waiter is cancelled while its connection is
// black-holed: the delete of its node is lost, and retried in the
// background once the connection is back.
func TestOrphanLostLeave(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	ttl := 3 * time.Second
	holder := connect(t, srv.Addr(), withTTL(ttl))
	waiter := connect(t, p.Addr(), withTTL(ttl))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "lostleave-" + testutil.RandomHex(4)
	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	c := acquireAsync(wctx, waiter, name)
	waitQueue(t, raw, name, 2)

	p.Blackhole()
	wcancel()
	if r := <-c; r.err == nil {
		t.Fatal("cancelled waiter granted")
	}
	if nodes, _ := lockNodes(raw, name); len(nodes) != 2 {
		t.Fatalf("the waiter's node went through a black hole: %v", nodes)
	}
	p.Heal() // resets the connection: the delete fails with zk: connection closed
	waitFor(t, 2*ttl, "deletion of the cancelled waiter's node", func() bool {
		nodes, _ := lockNodes(raw, name)
		return len(nodes) == 1
	})
	release(t, ls)
	noResidue(t, raw, name, 5*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

// TestOrphanLeaveWriteFails: a waiter is cancelled, and its connection is
// reset just as the delete of its node is written, so that the write fails
// with the socket's own error rather than zk: connection closed. The delete
// is retried once the connection is back.
func TestOrphanLeaveWriteFails(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	ttl := 3 * time.Second
	hd := &hookDialer{onWrite: func(op int32) bool {
		if op != opDelete {
			return false
		}
		p.Reset()
		time.Sleep(20 * time.Millisecond) // for the RST to arrive
		return true
	}}
	holder := connect(t, srv.Addr(), withTTL(ttl))
	waiter := connect(t, p.Addr(), &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}, Dialer: hd.dial})
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "leavewrite-" + testutil.RandomHex(4)
	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	c := acquireAsync(wctx, waiter, name)
	waitQueue(t, raw, name, 2)

	hd.armed.Store(true)
	wcancel()
	if r := <-c; r.err == nil {
		t.Fatal("cancelled waiter granted")
	}
	waitFor(t, 2*ttl, "deletion of the cancelled waiter's node", func() bool {
		nodes, _ := lockNodes(raw, name)
		return len(nodes) == 1
	})
	if hd.armed.Load() {
		t.Error("the delete was not written through the hook")
	}
	release(t, ls)
	noResidue(t, raw, name, 5*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

const opDelete = 2 // ZooKeeper's opcode

// hookDialer dials connections that call onWrite, while armed, with the
// opcode of each request frame about to be written (go-zookeeper writes one
// frame per Write: length, xid, opcode, body); when it returns true it is
// disarmed.
type hookDialer struct {
	armed   atomic.Bool
	onWrite func(op int32) bool
}

func (hd *hookDialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &hookConn{Conn: c, hd: hd}, nil
}

type hookConn struct {
	net.Conn
	hd *hookDialer
}

func (c *hookConn) Write(b []byte) (int, error) {
	if len(b) >= 12 && c.hd.armed.Load() {
		if c.hd.onWrite(int32(binary.BigEndian.Uint32(b[8:12]))) {
			c.hd.armed.Store(false)
		}
	}
	return c.Conn.Write(b)
}

// TestOrphanSweptOnResume: a node of the Locker's own session that no lease
// or waiter tracks (as a create whose outcome was lost can leave) sits at the
// head of the queue, and the Locker's own waiter queues behind it. When the
// session resumes after its connection was reset, the driver sweeps the
// name and deletes it, and the waiter is granted.
func TestOrphanSweptOnResume(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	ttl := 2 * time.Second
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	l, orphan, err := zookeeperexport.ConnectWithOrphans(cctx, []string{p.Addr()}, withTTL(ttl))
	ccancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "swept-" + testutil.RandomHex(4)
	op, err := orphan(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	c := acquireAsync(ctx, l, name)
	waitQueue(t, raw, name, 2)
	notGranted(t, c, "waiter behind the orphan")

	p.Reset()
	ls := granted(t, c, 10*time.Second, "waiter behind the orphan, after the session resumed")
	if ok, _, err := raw.Exists(op); ok || err != nil {
		t.Errorf("orphan %s still there (%v)", op, err)
	}
	release(t, ls)
	noResidue(t, raw, name, 5*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

// TestOrphanPause: the server is paused while several Lockers loop on one
// name (one holds, the others wait), and their paths to it are cut meanwhile
// so that they do not reconnect at once when it comes back (a reconnection
// that reaches the server before its expiry thread runs would revive the
// session). It then expires their sessions. Acquisitions made during the
// pause, queued in go-zookeeper, go to the new sessions when the paths heal:
// every Locker is granted again, and nothing is left once they stop.
func TestOrphanPause(t *testing.T) {
	t.Cleanup(zookeeperexport.SetIdleAfter(time.Minute)) // no idle session closes, which would take orphans along
	srv := dlocktest.RequireNewWith(t, dlocktest.ZooKeeper, fastConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ttl := time.Second
	const n = 4
	raw := rawConn(t, srv.Addr(), 30*time.Second)
	name := "pause-" + testutil.RandomHex(4)
	proxies := make([]*faultnet.Proxy, n)
	lockers := make([]*dlock.Locker, n)
	for i := range lockers {
		p := faultnet.ListenT(t, srv.Addr())
		proxies[i] = p
		lockers[i] = connect(t, p.Addr(), withTTL(ttl))
	}
	var (
		healed atomic.Int64 // unix nanoseconds
		after  [n]atomic.Int64
		wg     sync.WaitGroup
	)
	loopCtx, stop := context.WithCancel(ctx)
	defer stop()
	for i, l := range lockers {
		wg.Go(func() { loop(loopCtx, l, name, func() { after[i].Add(1) }, &healed) })
	}
	waitFor(t, 30*time.Second, "queue of three", func() bool {
		nodes, _ := lockNodes(raw, name)
		return len(nodes) >= 3
	})
	// Another node keeps the name's node from being deleted when the
	// sessions' lock nodes go, as another client's would.
	keep := zookeeper.LockPath("", name) + "/keep"
	if _, err := raw.Create(keep, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Delete(keep, -1) }()
	if err := srv.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.Blackhole()
	}
	time.Sleep(2500 * time.Millisecond) // the fault: longer than the TTL
	if err := srv.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	// The server expires the sessions, and their nodes go with them.
	waitFor(t, 30*time.Second, "expiry of the sessions", func() bool {
		nodes, err := lockNodes(raw, name)
		return err == nil && len(nodes) == 0
	})
	for _, p := range proxies {
		p.Heal()
	}
	healed.Store(time.Now().UnixNano())
	waitFor(t, 30*time.Second, "grant to every Locker after the pause", func() bool {
		for i := range after {
			if after[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	stop()
	wg.Wait()
	noResidue(t, raw, name, 10*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
}

// loop acquires and releases name until ctx ends, calling granted for each
// grant that comes after the time in since (unix ns; 0: not yet).
func loop(ctx context.Context, l *dlock.Locker, name string, granted func(), since *atomic.Int64) {
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ls, err := l.Acquire(actx, name, nil)
		cancel()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if s := since.Load(); s != 0 && time.Now().UnixNano() > s {
			granted()
		}
		time.Sleep(2 * time.Millisecond)
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = ls.Release(rctx) // a failed release ends at ValidUntil
		cancel()
	}
}

// TestOrphanChaos: a seeded random sequence of faults (black holes, resets
// and latency on each Locker's own path, server pauses) while four Lockers
// loop on one name; at no time do two leases that both believe themselves
// valid overlap. After the last fault heals every Locker is granted again,
// and nothing is left once they stop. DLOCK_ZK_CHAOS_SEED replays a seed;
// DLOCK_ZK_CHAOS_DURATION sets the length of the faulty part (default 15s).
func TestOrphanChaos(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("DLOCK_ZK_CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = s
	}
	length := 15 * time.Second
	if v := os.Getenv("DLOCK_ZK_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		length = d
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed: DLOCK_ZK_CHAOS_SEED=%d", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	srv := dlocktest.RequireNewWith(t, dlocktest.ZooKeeper, fastConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ttl := time.Second
	const n = 4
	raw := rawConn(t, srv.Addr(), 30*time.Second)
	name := "chaos-" + testutil.RandomHex(4)
	proxies := make([]*faultnet.Proxy, n)
	lockers := make([]*dlock.Locker, n)
	for i := range lockers {
		p := faultnet.ListenT(t, srv.Addr())
		proxies[i] = p
		lockers[i] = connect(t, p.Addr(), withTTL(ttl))
	}

	var (
		healed  atomic.Int64 // unix nanoseconds
		after   [n]atomic.Int64
		grants  atomic.Int64
		wg      sync.WaitGroup
		hmu     sync.Mutex
		holder  = -1 // the Locker inside, with its lease valid until until
		until   time.Time
		overlap atomic.Int64
	)
	loopCtx, stop := context.WithCancel(ctx)
	defer stop()
	for i, l := range lockers {
		wg.Go(func() {
			for loopCtx.Err() == nil {
				actx, cancel := context.WithTimeout(loopCtx, 10*time.Second)
				ls, err := l.Acquire(actx, name, nil)
				cancel()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				grants.Add(1)
				hmu.Lock()
				if holder >= 0 && time.Now().Before(until) {
					overlap.Add(1)
					t.Errorf("Locker %d granted while Locker %d's lease is valid for %v more", i, holder, time.Until(until))
				}
				holder, until = i, ls.ValidUntil()
				hmu.Unlock()
				if h := healed.Load(); h != 0 && time.Now().UnixNano() > h {
					after[i].Add(1)
				}
				time.Sleep(2 * time.Millisecond)
				hmu.Lock()
				if holder == i {
					holder = -1
				}
				hmu.Unlock()
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = ls.Release(rctx)
				cancel()
			}
		})
	}

	faults := map[string]int{}
	paused := false
	end := time.Now().Add(length)
	for time.Now().Before(end) {
		i := rng.IntN(n)
		hold := time.Duration(100+rng.IntN(1400)) * time.Millisecond
		switch k := rng.IntN(10); {
		case k < 3:
			// Up to three TTLs: the session may expire meanwhile.
			faults["blackhole"]++
			proxies[i].Blackhole()
			time.Sleep(2 * hold)
			proxies[i].Heal()
		case k < 6:
			faults["reset"]++
			proxies[i].Reset()
			time.Sleep(hold / 4)
		case k < 8:
			faults["latency"]++
			proxies[i].SetLatency(time.Duration(rng.IntN(200)) * time.Millisecond)
			time.Sleep(hold)
			proxies[i].SetLatency(0)
		default:
			faults["pause"]++
			if err := srv.Pause(ctx); err != nil {
				t.Fatal(err)
			}
			paused = true
			time.Sleep(hold + time.Duration(rng.IntN(1000))*time.Millisecond)
			if err := srv.Unpause(ctx); err != nil {
				t.Fatal(err)
			}
			paused = false
		}
	}
	if paused {
		t.Fatal("left paused")
	}
	healed.Store(time.Now().UnixNano())
	t.Logf("faults: %v; %d grants so far", faults, grants.Load())
	began := time.Now()
	waitFor(t, 45*time.Second, "grant to every Locker after the last fault healed", func() bool {
		for i := range after {
			if after[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("every Locker granted within %v of the last heal; %d grants", time.Since(began), grants.Load())
	stop()
	wg.Wait()
	noResidue(t, raw, name, 10*time.Second)
	freeFor(t, srv.Addr(), name, 10*time.Second)
	if overlap.Load() > 0 {
		t.Errorf("%d overlapping leases", overlap.Load())
	}
}

// orphanSetup is the start of the orphan tests: a server of the test's own,
// a path to it through a fault proxy, and a minute's ctx. Idle sessions stay
// open for the test (closing one would take its orphans along).
func orphanSetup(t *testing.T) (*dlocktest.Server, context.Context, *faultnet.Proxy) {
	t.Helper()
	t.Cleanup(zookeeperexport.SetIdleAfter(time.Minute))
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	p := faultnet.ListenT(t, srv.Addr())
	return srv, ctx, p
}
