package zookeeper_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// TestOpenRefusedFailsFast: a server that refuses connections fails Open at
// once (not when ctx ends), with an error that names the address and not
// the password.
func TestOpenRefusedFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	l, err := dlock.Open(ctx, "zk://u:s3cret@"+addr)
	took := time.Since(start)
	if err == nil {
		_ = l.Close(ctx)
		t.Fatalf("Open of a closed port succeeded")
	}
	if took > 2*time.Second {
		t.Errorf("Open took %v; want a refused connection reported at once", took)
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || strings.Contains(msg, "s3cret") {
		t.Errorf("Open error %q: want the address %s and no password", msg, addr)
	}
}
