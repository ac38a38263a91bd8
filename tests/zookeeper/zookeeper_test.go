package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	"github.com/go-zookeeper/zk"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// fastConfig is the test servers' zoo.cfg: a 20ms tick, so that sessions
// expire within 20ms of their timeout, and session timeouts from 100ms (the
// conformance suite's TTL is 500ms) to a minute.
var fastConfig = &servers.StartOptions{
	Cmd: []string{"tickTime=20", "minSessionTimeout=100", "maxSessionTimeout=60000"},
	// Empty container nodes are deleted every 100ms instead of every minute.
	Env: []string{"JVMFLAGS=-Dznode.container.checkIntervalMs=100"},
}

var (
	sharedOnce sync.Once
	sharedSrv  *servers.Server
	sharedErr  error
)

// zkServer returns the test binary's shared ZooKeeper server, with
// fastConfig (ZooKeeper is slow to start: one server serves every test that
// does not break it). With DLOCK_ZOOKEEPER_ADDR set, it is that server, as
// configured there.
func zkServer(t testing.TB) *servers.Server {
	t.Helper()
	if os.Getenv("DLOCK_ZOOKEEPER_ADDR") != "" {
		return servers.Require(t, servers.ZooKeeper)
	}
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		sharedSrv, sharedErr = servers.Start(ctx, servers.ZooKeeper, fastConfig)
	})
	if sharedErr != nil {
		if required, _ := strconv.ParseBool(os.Getenv(servers.RequireBackendsEnv)); errors.Is(sharedErr, servers.ErrNoDocker) && !required {
			t.Skipf("no zookeeper server: %v", sharedErr)
		}
		t.Fatalf("starting zookeeper server: %v", sharedErr)
	}
	return sharedSrv
}

// quiet discards go-zookeeper's log output.
var quiet = log.New(io.Discard, "", 0)

// rawConn returns a plain go-zookeeper connection to addr, with a session
// established, closed at cleanup.
func rawConn(t testing.TB, addr string, timeout time.Duration) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{addr}, timeout, zk.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	deadline := time.Now().Add(30 * time.Second)
	for c.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatalf("no session with %s within 30s", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
