package redis_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

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

// openClosed opens a redis:// and a redlock:// URL whose ports are closed,
// and wants both to fail: each dial's failure is a line for go-redis's
// process-wide logger.
func openClosed(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, u := range []string{
		"redis://" + closedAddr(t),
		"redlock://" + closedAddr(t) + "," + closedAddr(t) + "," + closedAddr(t),
	} {
		if l, err := dlock.Open(ctx, u); err == nil {
			_ = l.Close(ctx)
			t.Fatalf("Open(%s) succeeded", u)
		}
	}
}

// lineLogger is an application's go-redis logger: it keeps the lines.
type lineLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLogger) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

// count returns how many lines contain s.
func (l *lineLogger) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

const childEnv = "DLOCK_TEST_LOGGER_CHILD"

// TestImportKeepsGoRedisLogger: importing the redis and redlock drivers
// leaves go-redis's default logger in place. A fresh process that imported
// them (this test binary) and set no logger opens their URLs on closed
// ports: go-redis's default logger writes its dial failures to stderr, as
// for any client of the application's.
func TestImportKeepsGoRedisLogger(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		openClosed(t)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestImportKeepsGoRedisLogger$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v; stderr:\n%s", err, stderr.String())
	}
	if got := stderr.String(); !strings.Contains(got, "redis: ") || !strings.Contains(got, "failed to dial") {
		t.Fatalf("child's stderr %q; want go-redis's default logger's dial failure lines", got)
	}
}

// TestOpenKeepsApplicationLogger: dlock.Open of redis:// and redlock://
// URLs leaves the application's go-redis logger in place: it receives the
// lines about the clients Open made, and still those about the
// application's own client afterwards.
func TestOpenKeepsApplicationLogger(t *testing.T) {
	app := &lineLogger{}
	goredis.SetLogger(app)
	t.Cleanup(logging.Enable) // go-redis's default logger back

	openClosed(t)
	if n := app.count("failed to dial"); n < 2 {
		t.Fatalf("the application's logger got %d dial failure lines while dlock opened two URLs; want ≥ 2", n)
	}
	before := app.count("failed to dial")
	c := goredis.NewClient(&goredis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	_ = c.Ping(context.Background()).Err()
	if n := app.count("failed to dial"); n <= before {
		t.Fatalf("after dlock.Open, the application's own client's dial failure did not reach its logger (%d lines before, %d after)", before, n)
	}
}
