package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
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
	p := faultnet.ListenT(t, h.addr)
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

// Residue lists every node left under the name's node of each kind (the
// lock's, the semaphore's, the read/write lock's), holders' and waiters'
// alike, with its owner session: a node that outlives every lease and wait
// while its session lives is orphaned waiter state. The name's nodes
// themselves are containers, which the server deletes once they are empty
// (TestContainersVanish checks that).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	var left []string
	for _, parent := range []string{
		zookeeper.LockPath(h.root, name),
		zookeeper.SemaphorePath(h.root, name),
		zookeeper.RWLockPath(h.root, name),
	} {
		children, _, err := h.raw.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, c := range children {
			_, st, err := h.raw.Get(parent + "/" + c)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				continue // gone meanwhile
			case err != nil:
				return nil, err
			}
			left = append(left, fmt.Sprintf("%s/%s (session %#x)", parent, c, st.EphemeralOwner))
		}
	}
	return left, nil
}

func newHarness(t *testing.T) harness {
	srv := zkServer(t)
	return harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr(), 10*time.Second), root: "/dlock-conformance"}
}

// ownServer is a harness on a server of the test's own, which the suite's
// Chaos section may pause and restart.
type ownServer struct {
	harness
	srv *dlocktest.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// The suite runs on a server of its own, so that the Chaos section can pause
// and restart it; on an external server (DLOCK_ZOOKEEPER_ADDR) it runs
// without server faults. It runs at a 1s TTL: a lease's session times out
// with its TTL, and go-zookeeper drops a connection whose pings go
// unanswered for two thirds of that; at 500ms (333ms) a loaded machine
// dropped them in the middle of tests that expected none (busy run 10:
// RefreshExtends, ElectionObserve).
func TestConformance(t *testing.T) {
	cfg := conformance.Config{TTL: time.Second}
	if os.Getenv("DLOCK_ZOOKEEPER_ADDR") != "" {
		conformance.RunConfig(t, newHarness(t), cfg)
		return
	}
	srv := dlocktest.RequireNewWith(t, dlocktest.ZooKeeper, fastConfig)
	h := harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr(), 10*time.Second), root: "/dlock-conformance"}
	conformance.RunConfig(t, reconnecting{ownServer{h, srv}}, cfg)
}
