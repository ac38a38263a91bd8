package reach_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/etcd"
	_ "github.com/dlock/dlock/postgres"
	_ "github.com/dlock/dlock/redis"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/zookeeper"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// closedAddr returns an address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestOpenRefusedFailsFast: for every driver, a server that refuses
// connections fails Open soon (well before the 5s dial timeouts and the
// 30s ctx), with an error that names the address and not the password.
func TestOpenRefusedFailsFast(t *testing.T) {
	for _, scheme := range []string{"etcd", "zk", "redis", "postgres", "redlock"} {
		t.Run(scheme, func(t *testing.T) {
			addr := closedAddr(t)
			hosts := addr
			if scheme == "redlock" {
				hosts = addr + "," + closedAddr(t) + "," + closedAddr(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			path := "/db"
			if scheme == "redis" || scheme == "redlock" {
				path = "/0"
			}
			l, err := dlock.Open(ctx, scheme+"://u:s3cret@"+hosts+path)
			took := time.Since(start)
			if err == nil {
				_ = l.Close(ctx)
				t.Fatalf("Open of a closed port succeeded")
			}
			if took > 3*time.Second {
				t.Errorf("Open took %v; want a refused connection reported soon", took)
			}
			if msg := err.Error(); !strings.Contains(msg, addr) || strings.Contains(msg, "s3cret") {
				t.Errorf("Open error %q: want the address %s and no password", msg, addr)
			}
		})
	}
}
