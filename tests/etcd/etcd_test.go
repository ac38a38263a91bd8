package etcd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// fastElection makes etcd's minimum lease TTL 1s (1.5 × the election
// timeout, rounded up) instead of 2s; a single member never holds elections.
var fastElection = []string{"ETCD_HEARTBEAT_INTERVAL=50", "ETCD_ELECTION_TIMEOUT=500"}

var shared struct {
	sync.Mutex
	srv *servers.Server
}

// etcdServer returns the test binary's etcd server, started on first use with
// a 1s minimum lease TTL, and that minimum. An external server
// (DLOCK_ETCD_ADDR) is assumed to have etcd's default minimum, 2s.
func etcdServer(t testing.TB) (*servers.Server, time.Duration) {
	t.Helper()
	if os.Getenv("DLOCK_ETCD_ADDR") != "" {
		return servers.Require(t, servers.Etcd), 2 * time.Second
	}
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		s, err := servers.Start(ctx, servers.Etcd, &servers.StartOptions{Env: fastElection})
		if err != nil {
			if required, _ := strconv.ParseBool(os.Getenv(servers.RequireBackendsEnv)); errors.Is(err, servers.ErrNoDocker) && !required {
				t.Skipf("no etcd server: %v", err)
			}
			t.Fatalf("starting etcd: %v", err)
		}
		shared.srv = s // removed by CloseAll
	}
	return shared.srv, time.Second
}

// newClient returns a client of the given endpoints, closed at cleanup.
func newClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testPrefix returns a key prefix unique to t and, at cleanup (after the
// lockers registered later are closed), fails the test if anything is left
// under it, then deletes it. Keys of leases lost on purpose may linger
// until their TTL plus etcd's expiry slack: it waits that long.
func testPrefix(t *testing.T, raw *clientv3.Client, linger time.Duration) string {
	t.Helper()
	p := "dlocktest/" + randomHex(4) + "/"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+linger)
		defer cancel()
		deadline := time.Now().Add(linger + etcd.ExpirySlack)
		for {
			resp, err := raw.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Errorf("listing %s: %v", p, err)
				return
			}
			if len(resp.Kvs) == 0 {
				return
			}
			if time.Now().After(deadline) {
				for _, kv := range resp.Kvs {
					t.Errorf("key %q left behind", kv.Key)
				}
				_, _ = raw.Delete(ctx, p, clientv3.WithPrefix())
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return p
}

// newLocker returns a Locker on client, closed at cleanup.
func newLocker(t testing.TB, client *clientv3.Client, opts *etcd.Options) *dlock.Locker {
	t.Helper()
	l, err := etcd.New(client, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
