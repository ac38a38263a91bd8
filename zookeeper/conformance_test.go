package zookeeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// harness gives every locker sessions of its own, dialled through its own
// faultnet proxy to the shared server.
type harness struct {
	addr string
	raw  *zk.Conn // straight to the server, for Residue
	root string
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	o := &zookeeper.Options{Root: h.root}
	if defaults != nil {
		o.Defaults = *defaults
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, []string{p.Addr()}, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue lists the lock nodes left under the name's node. The name's node
// itself is a container, which the server deletes once it is empty
// (TestContainersVanish checks that).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	children, _, err := h.raw.Children(zookeeper.LockPath(h.root, name))
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	return children, err
}

func newHarness(t *testing.T) harness {
	srv := zkServer(t)
	return harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr(), 10*time.Second), root: "/dlock-conformance"}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}
