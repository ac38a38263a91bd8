package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/etcd"
)

// rpcCounts counts a client's unary calls by method suffix.
type rpcCounts struct {
	grants, ranges, txns, puts atomic.Int64
}

func countingClient(t *testing.T, addr string, n *rpcCounts) *clientv3.Client {
	t.Helper()
	counting := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch {
		case strings.HasSuffix(method, "/LeaseGrant"):
			n.grants.Add(1)
		case strings.HasSuffix(method, "/Range"):
			n.ranges.Add(1)
		case strings.HasSuffix(method, "/Txn"):
			n.txns.Add(1)
		case strings.HasSuffix(method, "/Put"):
			n.puts.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{counting}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Locks of one TTL share one etcd lease: acquiring 200 grants it once,
// holding them refreshes it with no read per key (the Locker's watch says
// what was deleted); a key deleted behind its lease's back ends that lease
// alone, at once; revoking the shared etcd lease ends every lease on it, and
// each reports it.
func TestSharedLeaseOnServer(t *testing.T) {
	srv, _ := etcdServer(t)
	var n rpcCounts
	c := countingClient(t, srv.Addr(), &n)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, c, &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	const count = 200
	leases := make([]*dlock.Lease, count)
	var err error
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("s%d", i), &dlock.Options{TTL: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if g := n.grants.Load(); g != 1 {
		t.Errorf("%d etcd leases granted for %d locks of one TTL, want 1", g, count)
	}
	id := leaseOf(t, ctx, raw, prefix+"s0/"+leases[0].Token())
	// Three refresh intervals (1s each): every lease refreshed three times.
	r0, t0, p0 := n.ranges.Load(), n.txns.Load(), n.puts.Load()
	time.Sleep(3 * time.Second)
	rs, ts, ps := n.ranges.Load()-r0, n.txns.Load()-t0, n.puts.Load()-p0
	t.Logf("3s of holding %d leases: %d reads, %d transactions, %d marker puts", count, rs, ts, ps)
	if ts != 0 || rs == 0 || rs > count/4 || ps != 0 {
		t.Errorf("3s of holding %d leases: %d reads, %d transactions, %d marker puts; want a read per batch (no write: nothing changed)", count, rs, ts, ps)
	}
	for i, ls := range leases {
		if ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
		if left := time.Until(ls.ValidUntil()); left < time.Second {
			t.Fatalf("lease %d valid for %v more: not refreshed", i, left)
		}
	}

	// One key deleted behind its lease's back: that lease alone is lost,
	// before any refresh could have found it (the watch tells).
	if _, err := raw.Delete(ctx, prefix+"s7/"+leases[7].Token()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases[7].Done():
	case <-time.After(time.Second):
		t.Fatal("the lease whose key was deleted was not lost within a second")
	}
	if !errors.Is(leases[7].Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v, want ErrLost", leases[7].Err())
	}
	time.Sleep(1500 * time.Millisecond) // a refresh round of the others
	for i, ls := range leases {
		if i != 7 && ls.Err() != nil {
			t.Fatalf("lease %d ended with another's key: %v", i, ls.Err())
		}
	}
	// A released lease's etcd lease is not revoked: the others hold on.
	if err := leases[8].Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The shared etcd lease revoked: every lease on it is lost, each
	// reporting it; a lease of another TTL (another etcd lease) is not.
	other, err := l.Acquire(ctx, "other-ttl", &dlock.Options{TTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i, ls := range leases {
		if i == 7 || i == 8 {
			continue
		}
		select {
		case <-ls.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("lease %d not lost after its etcd lease was revoked", i)
		}
		if !errors.Is(ls.Err(), dlock.ErrLost) {
			t.Fatalf("lease %d: Err = %v, want ErrLost", i, ls.Err())
		}
	}
	if other.Err() != nil {
		t.Fatalf("the lease on another etcd lease ended: %v", other.Err())
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The next acquisition gets a new shared etcd lease.
	ls, err := l.Acquire(ctx, "after", &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := leaseOf(t, ctx, raw, prefix+"after/"+ls.Token()); got == id {
		t.Errorf("acquired on the revoked etcd lease %x", id)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lock that is not refreshed ends at its own TTL although the etcd lease
// it shares is kept alive by a neighbour's refreshes: its key is deleted,
// and another Locker takes the name.
func TestSharedLeaseUnrefreshedExpires(t *testing.T) {
	srv, _ := etcdServer(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	other := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	ttl := 3 * time.Second
	kept, err := l.Acquire(ctx, "kept", &dlock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	left, err := l.Acquire(ctx, "left", &dlock.Options{TTL: ttl, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := leaseOf(t, ctx, raw, prefix+"kept/"+kept.Token()), leaseOf(t, ctx, raw, prefix+"left/"+left.Token()); a != b {
		t.Fatalf("etcd leases %x and %x: want them shared", a, b)
	}
	select {
	case <-left.Done():
	case <-time.After(ttl + time.Second):
		t.Fatal("the lease without refresh did not end at its TTL")
	}
	deadline := left.ValidUntil().Add(etcd.ExpirySlack)
	for {
		ls, err := other.TryAcquire(ctx, "left", &dlock.Options{TTL: ttl})
		if err == nil {
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the name of a lease not refreshed is still taken %v after its ValidUntil", etcd.ExpirySlack)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if kept.Err() != nil {
		t.Fatalf("the refreshed lease ended: %v", kept.Err())
	}
}

// A key put on a Locker's shared etcd lease that no lease of the Locker
// holds (an abandoned attempt's put applied after its deletion) is deleted
// by the Locker's watch.
func TestSharedLeaseOrphanDeleted(t *testing.T) {
	srv, _ := etcdServer(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	ls, err := l.Acquire(ctx, "held", &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	id := leaseOf(t, ctx, raw, prefix+"held/"+ls.Token())
	orphan := prefix + "orphan/" + strings.Repeat("ab", 16)
	if _, err := raw.Put(ctx, orphan, "", clientv3.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := raw.Get(ctx, orphan, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the orphan key is still there after 2s")
		}
	}
	if ls.Err() != nil {
		t.Fatalf("the held lease ended: %v", ls.Err())
	}
}

// A key deleted while the Locker's watch was cut off, with the history
// compacted before it comes back, still ends its lease: the watch, unable
// to resume, reads every key the Locker holds.
func TestSharedLeaseWatchCompacted(t *testing.T) {
	srv, _ := etcdServer(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	l := newLocker(t, newClient(t, p.Addr()), &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	opts := &dlock.Options{TTL: 6 * time.Second}
	gone, err := l.Acquire(ctx, "gone", opts)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := l.Acquire(ctx, "kept", opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if _, err := raw.Delete(ctx, prefix+"gone/"+gone.Token()); err != nil {
		t.Fatal(err)
	}
	resp, err := raw.Put(ctx, prefix+"other", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a refresh or two lost in the black hole
	p.Heal()
	select {
	case <-gone.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease whose key was deleted during the cut was not lost")
	}
	if !errors.Is(gone.Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v, want ErrLost", gone.Err())
	}
	time.Sleep(2500 * time.Millisecond) // refreshes of the other after the cut
	if kept.Err() != nil {
		t.Fatalf("the other lease ended: %v", kept.Err())
	}
	if _, err := raw.Delete(ctx, prefix+"other"); err != nil {
		t.Fatal(err)
	}
}

// With the revision moving outside the prefix (where the Locker's watch
// sees nothing), refreshes put the Locker's marker key to know the watch
// has caught up, and go on succeeding; a key deleted meanwhile is still
// found.
func TestSharedLeaseMarker(t *testing.T) {
	srv, _ := etcdServer(t)
	var n rpcCounts
	c := countingClient(t, srv.Addr(), &n)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, c, &etcd.Options{KeyPrefix: prefix})
	ctx := testCtx(t)
	opts := &dlock.Options{TTL: 3 * time.Second}
	kept, err := l.Acquire(ctx, "kept", opts)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := l.Acquire(ctx, "gone", opts)
	if err != nil {
		t.Fatal(err)
	}
	outside := strings.TrimSuffix(prefix, "/") + "-outside"
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := raw.Put(ctx, outside, "x"); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { _, _ = raw.Delete(context.Background(), outside) })
	time.Sleep(1500 * time.Millisecond)
	if _, err := raw.Delete(ctx, prefix+"gone/"+gone.Token()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	<-done
	if kept.Err() != nil {
		t.Fatalf("the lease ended while the revision moved outside its prefix: %v", kept.Err())
	}
	if left := time.Until(kept.ValidUntil()); left < time.Second {
		t.Fatalf("the lease is valid for %v more: not refreshed", left)
	}
	if !errors.Is(gone.Err(), dlock.ErrLost) {
		t.Fatalf("the lease whose key was deleted: Err = %v, want ErrLost", gone.Err())
	}
	if n.puts.Load() == 0 {
		t.Fatal("no marker put while the revision moved outside the prefix")
	}
}
