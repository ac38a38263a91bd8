package etcd_test

import (
	"context"
	"github.com/dlock/dlock/internal/testexport/etcdexport"
	"os"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/etcd"
	"github.com/dlock/dlock/internal/servers"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// harness gives every locker its own etcd client dialling the shared server
// through its own faultnet proxy.
type harness struct {
	addr    string
	raw     *clientv3.Client // straight to the server, for Residue
	prefix  string
	perLock bool // Options.LeasePerLock
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := newClient(t, p.Addr())
	o := &etcd.Options{KeyPrefix: h.prefix, LeasePerLock: h.perLock}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := etcd.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue lists the keys of the name in every namespace: the lock's queue,
// the semaphore's and the read/write lock's keys (holders and waiters).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	var left []string
	for _, p := range []string{
		etcd.MutexName(h.prefix, name) + "/",
		etcdexport.SemaphorePrefix(h.prefix, name),
		etcd.RWMutexName(h.prefix, name) + "/",
	} {
		resp, err := h.raw.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			left = append(left, string(kv.Key))
		}
	}
	return left, nil
}

// ownServer is a harness on a server of the test's own, which the suite's
// Chaos section may pause and restart.
type ownServer struct {
	harness
	srv *servers.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// The suite runs on a server of its own, so that the Chaos section can pause
// and restart it; on an external server (DLOCK_ETCD_ADDR) it runs without
// server faults.
func TestConformance(t *testing.T) {
	if os.Getenv("DLOCK_ETCD_ADDR") != "" {
		srv, minTTL := etcdServer(t)
		raw := newClient(t, srv.Addr())
		conformance.RunConfig(t, harness{addr: srv.Addr(), raw: raw, prefix: "dlockconf/"}, conformance.Config{TTL: minTTL})
		return
	}
	srv := servers.RequireNewWith(t, servers.Etcd, &servers.StartOptions{Env: fastElection})
	raw := newClient(t, srv.Addr())
	h := harness{addr: srv.Addr(), raw: raw, prefix: "dlockconf/"}
	conformance.RunConfig(t, ownServer{h, srv}, conformance.Config{TTL: time.Second})
}

// The suite passes with an etcd lease per lock too (server faults only in
// TestConformance, which covers the default).
func TestConformanceLeasePerLock(t *testing.T) {
	srv, minTTL := etcdServer(t)
	raw := newClient(t, srv.Addr())
	conformance.RunConfig(t, harness{addr: srv.Addr(), raw: raw, prefix: "dlockconfown/", perLock: true}, conformance.Config{TTL: minTTL})
}
