package redislog_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/redislog"
	_ "github.com/dlock/dlock/redis"
	_ "github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// closedPort returns an address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestOpenWritesNothing: opening redis and redlock URLs whose ports are
// closed fails with an error and writes no go-redis line, while the
// application's own client still logs as go-redis does by default.
func TestOpenWritesNothing(t *testing.T) {
	var buf syncBuffer
	defer redislog.SetOutput(&buf)()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, u := range []string{
		"redis://" + closedPort(t),
		"redlock://" + closedPort(t) + "," + closedPort(t) + "," + closedPort(t),
	} {
		if l, err := dlock.Open(ctx, u); err == nil {
			_ = l.Close(ctx)
			t.Fatalf("Open(%s) succeeded", u)
		}
	}
	if got := buf.String(); got != "" {
		t.Fatalf("go-redis wrote %q while dlock opened URLs", got)
	}

	// The application's client is not dlock's: its lines still come out.
	app := goredis.NewClient(&goredis.Options{Addr: closedPort(t), MaxRetries: -1, DialerRetries: 1})
	defer app.Close()
	_ = app.Ping(ctx).Err()
	if got := buf.String(); !strings.Contains(got, "failed to dial") {
		t.Fatalf("the application's client logged %q; want go-redis's dial failure line", got)
	}
}
