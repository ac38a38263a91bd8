package zookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/dlock/dlock/tests/internal/testutil"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// existsCounter counts the exists requests a Locker's sockets carry: probes
// (of "/"), with a watch (a batched refresh setting a lease's watch), and
// without (Refresh's one per lease); deletes and multi-ops; and, in the
// multi-ops, the set-data operations (an acquisition's multi-op is a create
// and a set-data of the name's node) and the most one multi-op carried.
type existsCounter struct {
	probes, watched, plain atomic.Int64
	deletes, multis        atomic.Int64
	setDatas, mostSetDatas atomic.Int64
}

const (
	opCreate  = 1
	opSetData = 5
	opCheck   = 13
	opExists  = 3
	opMulti   = 14
)

// multiSetDatas counts the set-data operations in a multi-op request's
// body (after length, xid and opcode): operations each behind a header
// (type int32, done bool, err int32) until one with done set.
func multiSetDatas(b []byte) int64 {
	var n int64
	u32 := func() (int, bool) {
		if len(b) < 4 {
			return 0, false
		}
		v := int(int32(binary.BigEndian.Uint32(b)))
		b = b[4:]
		return v, true
	}
	skip := func(k int) bool {
		if k < 0 { // a nil buffer
			k = 0
		}
		if len(b) < k {
			return false
		}
		b = b[k:]
		return true
	}
	str := func() bool { k, ok := u32(); return ok && skip(k) }
	for len(b) >= 9 {
		typ, done := int32(binary.BigEndian.Uint32(b)), b[4] != 0
		b = b[9:]
		if done {
			return n
		}
		ok := str() // path
		switch typ {
		case opCreate:
			ok = ok && str() // data
			acls, ok2 := u32()
			ok = ok && ok2
			for range acls {
				ok = ok && skip(4) && str() && str() // perms, scheme, id
			}
			ok = ok && skip(4) // flags
		case opSetData:
			n++
			ok = ok && str() && skip(4) // data, version
		case opDelete, opCheck:
			ok = ok && skip(4) // version
		default:
			return n // not one the driver sends
		}
		if !ok {
			return n
		}
	}
	return n
}

func (ec *existsCounter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, ec: ec}, nil
}

// countingConn parses the frames go-zookeeper writes, one per Write: the
// connect request first, then requests (length, xid, opcode, body).
type countingConn struct {
	net.Conn
	ec        *existsCounter
	handshake bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	op := int32(-1)
	if c.handshake && len(p) >= 12 {
		op = int32(binary.BigEndian.Uint32(p[8:12]))
	}
	switch op {
	case opDelete:
		c.ec.deletes.Add(1)
	case opMulti:
		c.ec.multis.Add(1)
		n := multiSetDatas(p[12:])
		c.ec.setDatas.Add(n)
		for m := c.ec.mostSetDatas.Load(); n > m && !c.ec.mostSetDatas.CompareAndSwap(m, n); m = c.ec.mostSetDatas.Load() {
		}
	}
	if !c.handshake {
		c.handshake = true
	} else if len(p) >= 16 && op == opExists {
		n := int(binary.BigEndian.Uint32(p[12:16]))
		if len(p) >= 16+n+1 {
			switch {
			case string(p[16:16+n]) == "/":
				c.ec.probes.Add(1)
			case p[16+n] != 0:
				c.ec.watched.Add(1)
			default:
				c.ec.plain.Add(1)
			}
		}
	}
	return c.Conn.Write(p)
}

// holdMany acquires n names with l and returns the leases and their lock
// nodes' paths.
func holdMany(t *testing.T, ctx context.Context, l *dlock.Locker, raw *zk.Conn, n int) ([]*dlock.Lease, []string) {
	t.Helper()
	prefix := "batch-" + testutil.RandomHex(4) + "-"
	leases := make([]*dlock.Lease, n)
	paths := make([]string, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("%s%d", prefix, i), nil); err != nil {
			t.Fatal(err)
		}
		parent := zookeeper.LockPath("", leases[i].Name())
		children, _, err := raw.Children(parent)
		if err != nil || len(children) != 1 {
			t.Fatalf("children of %s: %v (%v), want one", parent, children, err)
		}
		paths[i] = parent + "/" + children[0]
	}
	return leases, paths
}

// lostBy waits for ls to be lost, and checks that no refresh sent after
// deleted (when its node was deleted) extended it: its ValidUntil is at
// most a TTL after that.
func lostBy(t *testing.T, ls *dlock.Lease, deleted time.Time, within time.Duration) {
	t.Helper()
	select {
	case <-ls.Done():
	case <-time.After(within):
		t.Fatalf("the lease whose node was deleted was not lost within %v", within)
	}
	if !errors.Is(ls.Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v, want ErrLost", ls.Err())
	}
	if v, limit := ls.ValidUntil(), deleted.Add(ls.TTL()); v.After(limit) {
		t.Fatalf("its ValidUntil %v after the node was deleted, beyond a TTL (%v) after that: a refresh missed the deletion",
			v.Sub(deleted), ls.TTL())
	}
}

// waitCount waits until c reaches at least want.
func waitCount(t *testing.T, c *atomic.Int64, want int64, what string) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d %s (%d so far)", want, what, c.Load()), func() bool { return c.Load() >= want })
}

// The watchdog refreshes a Locker's leases with one probe per batch once
// each lease's node carries a watch (set by one exists request per lease),
// not an exists request per lease per refresh; a node deleted behind its
// lease's back loses that lease alone, without a refresh extending it past
// the deletion.
func TestBatchedRefreshProbes(t *testing.T) {
	srv := zkServer(t)
	ec := &existsCounter{}
	o := withTTL(time.Second)
	o.Dialer = ec.dial
	l := connect(t, srv.Addr(), o)
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 200
	leases, paths := holdMany(t, ctx, l, raw, n)
	waitCount(t, &ec.watched, n, "watches set")
	p0, w0, e0 := ec.probes.Load(), ec.watched.Load(), ec.plain.Load()
	waitCount(t, &ec.probes, p0+9, "probes") // three refresh intervals at least
	p, w, e := ec.probes.Load()-p0, ec.watched.Load()-w0, ec.plain.Load()-e0
	t.Logf("refreshes of %d leases: %d probes, %d exists with a watch, %d without", n, p, w, e)
	if w+e > n/10 {
		t.Errorf("%d exists requests with a watch and %d without during %d probes of %d leases: want the leases covered by the probes", w, e, p, n)
	}

	if err := raw.Delete(paths[7], -1); err != nil {
		t.Fatal(err)
	}
	lostBy(t, leases[7], time.Now(), 10*time.Second)
	waitCount(t, &ec.probes, ec.probes.Load()+6, "probes after the loss")
	for i, ls := range leases {
		if i == 7 {
			continue
		}
		if ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
		release(t, ls)
	}
}

// After a reconnection, a watch set on the earlier connection counts for
// nothing until set again (the server may answer a probe before
// go-zookeeper's request setting the watches again): a node deleted while
// the Locker was cut off loses its lease, without a refresh extending it
// past the deletion, and the other leases are kept, their watches set
// again.
func TestBatchedRefreshReconnect(t *testing.T) {
	srv, ctx, p := orphanSetup(t)
	ec := &existsCounter{}
	// The kept leases must outlive the reconnection: a new connection and
	// session handshake, the watches set again and a probe. At a 2s TTL,
	// beside two busy loops (load ~7), one of the 49 was not refreshed in
	// time; the deleted one's check (a ValidUntil no later than a TTL past
	// the deletion) holds at any TTL.
	o := withTTL(4 * time.Second)
	o.Dialer = ec.dial
	l := connect(t, p.Addr(), o)
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	const n = 50
	leases, paths := holdMany(t, ctx, l, raw, n)
	waitCount(t, &ec.watched, n, "watches set")
	waitCount(t, &ec.probes, ec.probes.Load()+3, "probes")
	w0 := ec.watched.Load()

	p.Blackhole()
	if err := raw.Delete(paths[7], -1); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	p.Reset()
	p.Heal()
	lostBy(t, leases[7], deleted, 10*time.Second)
	waitCount(t, &ec.watched, w0+n-1, "watches set again")
	waitCount(t, &ec.probes, ec.probes.Load()+6, "probes after the reconnection")
	for i, ls := range leases {
		if i == 7 {
			continue
		}
		if ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
		release(t, ls)
	}
}

// Concurrent releases go to the server together, as multi-ops of deletes,
// and each still has its own outcome: a release whose node was deleted
// behind its back reports the loss, the others in its request release.
//
// The leases are refreshed: taking 300 one after another took 20-35s at
// load ~30 on 2 cores, and without refresh (TTL 10s) the first ones had
// expired and been abandoned (their nodes deleted by the Locker) before
// the test deleted them, which failed with "zk: node does not exist". A
// refresh (every 20s) that finds a deleted node first ends that lease with
// ErrLost, which its Release then returns: the same outcome.
func TestReleasesGrouped(t *testing.T) {
	srv := zkServer(t)
	ec := &existsCounter{}
	o := withTTL(time.Minute)
	o.Dialer = ec.dial
	l := connect(t, srv.Addr(), o)
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 300
	start := time.Now()
	leases, paths := holdMany(t, ctx, l, raw, n)
	t.Logf("%d leases taken in %v", n, time.Since(start).Round(time.Millisecond))
	gone := map[int]bool{}
	for i := 5; i < n; i += 30 {
		if err := raw.Delete(paths[i], -1); err != nil {
			t.Fatal(err)
		}
		gone[i] = true
	}
	d0, m0 := ec.deletes.Load(), ec.multis.Load()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, ls := range leases {
		wg.Go(func() { errs[i] = ls.Release(ctx) })
	}
	wg.Wait()
	d, m := ec.deletes.Load()-d0, ec.multis.Load()-m0
	t.Logf("%d releases: %d delete requests, %d multi-ops", n, d, m)
	for i, err := range errs {
		switch {
		case gone[i] && !errors.Is(err, dlock.ErrLost):
			t.Errorf("release %d, its node deleted behind its back: %v, want ErrLost", i, err)
		case !gone[i] && err != nil:
			t.Errorf("release %d: %v", i, err)
		}
		if ok, _, err := raw.Exists(paths[i]); ok || err != nil {
			t.Errorf("node %s still there after its release (%v)", paths[i], err)
		}
	}
	if m == 0 || d+m >= n {
		t.Errorf("%d releases in %d deletes and %d multi-ops: want them grouped", n, d, m)
	}
}

// Concurrent acquisitions share multi-ops, and each keeps its own outcome:
// names whose node the Locker saw before but the server has deleted since
// (an empty container) fail their creates in the shared request with
// NoNode, are taken out of it and create the node again, and every one is
// granted with exactly one lock node, the others in the request unharmed.
//
// How many multi-ops it takes is not a promise: each failing name costs a
// multi-op of its own (only a multi-op's first failure is reported), and on
// a loaded machine callers come spread out (smaller groups) and the server
// may delete a name's node again before the caller's retry lands. What is
// asserted is the grouping itself: some multi-op carried the operations of
// several acquisitions. (With a 2s TTL, at load ~40-50, grants came back
// expired and were retried: 269 to 723 multi-ops for 100; with 20s, 118.)
func TestAcquisitionsGrouped(t *testing.T) {
	srv := zkServer(t)
	ec := &existsCounter{}
	// Nothing here is about TTLs: one long enough that no lease lapses
	// before the last of the 100 is granted and the nodes are checked (at
	// 2s, under load ~50, a grant came back expired and a granted lease's
	// node was gone by the check).
	o := withTTL(20 * time.Second)
	o.Dialer = ec.dial
	l := connect(t, srv.Addr(), o)
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 100
	prefix := "grouped-" + testutil.RandomHex(4) + "-"
	name := func(i int) string { return fmt.Sprintf("%s%d", prefix, i) }
	for i := range n {
		ls, err := l.TryAcquire(ctx, name(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		release(t, ls)
	}
	// The server deletes the empty name nodes (every 100ms here).
	waitFor(t, 30*time.Second, "name nodes deleted", func() bool {
		for i := range n {
			if ok, _, err := raw.Exists(zookeeper.LockPath("", name(i))); ok || err != nil {
				return false
			}
		}
		return true
	})
	m0, sd0 := ec.multis.Load(), ec.setDatas.Load()
	ec.mostSetDatas.Store(0)
	leases := make([]*dlock.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { leases[i], errs[i] = l.Acquire(ctx, name(i), nil) })
	}
	wg.Wait()
	m, sd := ec.multis.Load()-m0, ec.setDatas.Load()-sd0
	t.Logf("%d acquisitions of names whose node was gone: %d multi-ops carrying %d acquisition attempts, at most %d in one",
		n, m, sd, ec.mostSetDatas.Load())
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("acquisition %d: %v", i, errs[i])
		}
		children, _, err := raw.Children(zookeeper.LockPath("", name(i)))
		if err != nil || len(children) != 1 {
			t.Fatalf("%s: children %v (%v), want one lock node", name(i), children, err)
		}
	}
	if most := ec.mostSetDatas.Load(); most < 2 {
		t.Errorf("%d multi-ops for %d acquisitions, at most %d acquisition in one: want them grouped", m, n, most)
	}
	for _, ls := range leases {
		release(t, ls)
	}
}
