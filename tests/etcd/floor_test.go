package etcd_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/dlock/dlock/cmd/dlock/bench"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The bench's raw etcd floor: create-if-absent with a lease, compare-and-
// delete by token; Close revokes its lease, and with it any key it holds.
func TestFloor(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	open, err := bench.EtcdFloors(&url.URL{Scheme: "etcd", Host: srv.Addr(), Path: prefix})
	if err != nil {
		t.Fatal(err)
	}
	a, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	try := func(f bench.Floor, token string, want bool) {
		t.Helper()
		if ok, err := f.TryLock(ctx, "n", token, 5*time.Second); ok != want || err != nil {
			t.Fatalf("TryLock(%s) = %v, %v; want %v", token, ok, err, want)
		}
	}
	try(a, "a1", true)
	try(b, "b1", false)
	if err := b.Unlock(ctx, "n", "b1"); err != nil { // not b's: no-op
		t.Fatal(err)
	}
	try(b, "b2", false)
	if err := a.Unlock(ctx, "n", "a1"); err != nil {
		t.Fatal(err)
	}
	try(b, "b3", true)
	if err := b.Unlock(ctx, "n", "b3"); err != nil {
		t.Fatal(err)
	}
	try(a, "a2", true)
	if err := a.Close(); err != nil { // revokes the lease: the key goes
		t.Fatal(err)
	}
	resp, err := raw.Get(ctx, prefix+"n", clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("key after the floor's Close: %v, %v", resp, err)
	}
	if _, err := bench.EtcdFloors(&url.URL{Scheme: "redis", Host: srv.Addr()}); err == nil {
		t.Error("EtcdFloors accepted a redis URL")
	}
}
