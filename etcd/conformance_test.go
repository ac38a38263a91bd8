package etcd_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// harness gives every locker its own etcd client dialling the shared server
// through its own faultnet proxy.
type harness struct {
	addr   string
	raw    *clientv3.Client // straight to the server, for Residue
	prefix string
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := newClient(t, p.Addr())
	o := &etcd.Options{KeyPrefix: h.prefix}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := etcd.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue lists the keys under the name's queue prefix: locks and waiters.
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	resp, err := h.raw.Get(ctx, etcd.MutexName(h.prefix, name)+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	var left []string
	for _, kv := range resp.Kvs {
		left = append(left, string(kv.Key))
	}
	return left, nil
}

func TestConformance(t *testing.T) {
	srv, minTTL := etcdServer(t)
	raw := newClient(t, srv.Addr())
	conformance.RunConfig(t, harness{addr: srv.Addr(), raw: raw, prefix: "dlockconf/"}, conformance.Config{TTL: minTTL})
}
