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
	"github.com/dlock/dlock/etcd"
)

// With LeasePerLock, the watchdog refreshes many leases in a few requests
// (one keep-alive stream, transactions of reads), not a renewal and a read
// each; a key deleted behind a lease's back loses only that lease.
func TestBatchedRefreshOnServer(t *testing.T) {
	srv, _ := etcdServer(t)
	var ranges, txns, streams atomic.Int64
	counting := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch {
		case strings.HasSuffix(method, "/Range"):
			ranges.Add(1)
		case strings.HasSuffix(method, "/Txn"):
			txns.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	streaming := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if strings.HasSuffix(method, "/LeaseKeepAlive") {
			streams.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	})
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Addr()}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{counting, streaming}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, c, &etcd.Options{KeyPrefix: prefix, LeasePerLock: true})
	ctx := testCtx(t)
	const n = 200
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("b%d", i), &dlock.Options{TTL: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	// The single path would read each key with a Range of its own.
	r0, t0, s0 := ranges.Load(), txns.Load(), streams.Load()
	rounds := func(k int64) {
		t.Helper()
		from := txns.Load()
		for end := time.Now().Add(30 * time.Second); txns.Load() < from+k; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("fewer than %d batched refreshes in 30s", k)
			}
		}
	}
	rounds(3)
	rs, ts, ss := ranges.Load()-r0, txns.Load()-t0, streams.Load()-s0
	t.Logf("refreshes of %d leases: %d reads alone, %d transactions, %d keep-alive streams", n, rs, ts, ss)
	if rs > n/10 || ts == 0 || ts > n/4 || ss > n/4 {
		t.Errorf("%d reads alone, %d transactions, %d keep-alive streams for %d leases: want them batched", rs, ts, ss, n)
	}
	// Delete one key behind its lease's back: that lease alone is lost.
	if _, err := raw.Delete(ctx, prefix+"b7/"+leases[7].Token()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases[7].Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the lease whose key was deleted was not lost")
	}
	if !errors.Is(leases[7].Err(), dlock.ErrLost) {
		t.Fatalf("its Err = %v", leases[7].Err())
	}
	rounds(3) // the others go on being refreshed
	for i, ls := range leases {
		if i == 7 {
			continue
		}
		if ls.Err() != nil {
			t.Fatalf("lease %d ended: %v", i, ls.Err())
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
