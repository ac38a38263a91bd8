package zk_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/internal/servers/servertest"
	izk "github.com/dlock/dlock/internal/zk"
	"github.com/go-zookeeper/zk"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// upstreamEnv, set to 1, runs TestReconnectWithWatches with upstream's
// client instead of this copy, to see it fail under -race with the data
// race on Conn.lastZxid that this copy fixes:
//
//	DLOCK_ZK_UPSTREAM=1 go test -race -run TestReconnectWithWatches ./internal/zk/
const upstreamEnv = "DLOCK_ZK_UPSTREAM"

// client is what the test calls, on either client.
type client interface {
	Exists(path string) (bool, *zk.Stat, error)
	ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error)
	Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	Close()
}

// dial connects to addr (session timeout 30s) with this copy, or with
// upstream's client (upstreamEnv); cb receives the connection's events. The
// connection is closed at cleanup, which waits for its goroutines.
func dial(t *testing.T, addr string, cb func(zk.Event)) client {
	t.Helper()
	quiet := log.New(io.Discard, "", 0)
	var (
		c      client
		events <-chan zk.Event
		err    error
	)
	if os.Getenv(upstreamEnv) == "1" {
		t.Logf("%s=1: upstream's client", upstreamEnv)
		c, events, err = zk.Connect([]string{addr}, 30*time.Second, zk.WithLogger(quiet), zk.WithEventCallback(cb), zk.WithHostProvider(&oneHost{}))
	} else {
		c, events, err = izk.Connect([]string{addr}, 30*time.Second, izk.WithLogger(quiet), izk.WithEventCallback(cb), izk.WithHostProvider(&oneHost{}))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for range events { // closed once the connection's goroutines are done
		}
	})
	return c
}

// oneHost is a zk.HostProvider for one server that, unlike
// zk.DNSHostProvider, does not wait a second before reconnecting to the
// server that just worked: only after a failed attempt.
type oneHost struct {
	mu       sync.Mutex
	server   string
	attempts int // since the last successful connection
}

func (h *oneHost) Init(servers []string) error {
	if len(servers) != 1 {
		return fmt.Errorf("oneHost: %d servers", len(servers))
	}
	h.server = servers[0]
	return nil
}

func (h *oneHost) Len() int { return 1 }

func (h *oneHost) Next() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts++
	return h.server, h.attempts > 1
}

func (h *oneHost) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts = 0
}

// TestReconnectWithWatches: a connection with watches outstanding is reset
// again and again while requests are in flight. On each new connection the
// client sends the watches again (sendSetWatches, reading lastZxid) while
// its receive loop records the zxid of each reply (writing it): upstream's
// v1.0.4 does both without synchronisation, which the race detector
// reports (go-zookeeper/zk#35); this copy must not. And the watches must
// still fire after all those reconnections.
func TestReconnectWithWatches(t *testing.T) {
	began := time.Now()
	srv := servers.Require(t, servers.ZooKeeper)
	p, err := faultnet.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	sessions := make(chan struct{}, 100) // one per StateHasSession
	c := dial(t, p.Addr(), func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
			select {
			case sessions <- struct{}{}:
			default:
			}
		}
	})
	connected := func() {
		t.Helper()
		select {
		case <-sessions:
		case <-time.After(30 * time.Second):
			t.Fatal("no session within 30s")
		}
		// A reply on the new connection: its receive loop wrote lastZxid.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, _, err := c.Exists("/")
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no reply within 30s of the session: %v", err)
			}
			select {
			case <-sessions: // reset again meanwhile
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	connected()

	base := "/dlock-zk-reconnect-" + randHex()
	// Many watches: sendSetWatches reads lastZxid first, then goes through
	// them all before it sends anything, while the replies to the requests
	// queued during the reset come in.
	const nwatches = 2000
	watches := make([]<-chan zk.Event, nwatches)
	var set sync.WaitGroup
	for w := range 8 {
		set.Go(func() {
			for i := w; i < nwatches; i += 8 {
				ok, _, ch, err := c.ExistsW(fmt.Sprintf("%s-%d", base, i))
				if err != nil || ok {
					t.Errorf("ExistsW: %v, %v", ok, err)
					return
				}
				watches[i] = ch
			}
		})
	}
	set.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d watches set (%v)", nwatches, time.Since(began))

	// Requests in flight across every reset.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, _ = c.Exists("/")
			}
		})
	}
	const want = 100
	resets := 0
	deadline := time.Now().Add(5 * time.Second)
	for resets < want && time.Now().Before(deadline) {
		for len(sessions) > 0 {
			<-sessions
		}
		p.Reset()
		connected()
		resets++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d resets (%v)", resets, time.Since(began))
	if resets < want/4 {
		t.Fatalf("%d resets within 5s, want at least %d", resets, want/4)
	}

	// The watches were set again on each connection: they fire now (a
	// sample of them).
	for i := 0; i < nwatches; i += nwatches / 16 {
		path := fmt.Sprintf("%s-%d", base, i)
		if _, err := c.Create(path, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-watches[i]:
			if ev.Type != zk.EventNodeCreated || ev.Path != path {
				t.Fatalf("watch %d: got %v on %q, want EventNodeCreated on %q", i, ev.Type, ev.Path, path)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watch %d did not fire within 10s of the create", i)
		}
	}
	t.Logf("watches fired (%v)", time.Since(began))
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
