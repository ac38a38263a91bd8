package dlocktest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

// The echo kind is registered as a third party would, through the public
// API alone: its build context (testdata/echo), its port and its health
// check.
const echo dlocktest.Kind = "echo-test"

var registerEcho = sync.OnceValue(func() error {
	return dlocktest.Register(dlocktest.Image{Kind: echo, Context: os.DirFS("testdata/echo"), Port: 7000, Ping: pingEcho})
})

// pingEcho sends a line and wants it back.
func pingEcho(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	if line != "ping\n" {
		return fmt.Errorf("echo: got %q", line)
	}
	return nil
}

// TestRegisterRefuses proves that Register checks an Image before any call
// to Docker, and that a refused one leaves its kind unknown.
func TestRegisterRefuses(t *testing.T) {
	ping := func(context.Context, string) error { return nil }
	good := fstest.MapFS{"Dockerfile": {Data: []byte("FROM debian:bookworm-slim\n")}}
	for _, tc := range []struct {
		name string
		img  dlocktest.Image
	}{
		{"no kind", dlocktest.Image{Context: good, Port: 1, Ping: ping}},
		{"upper case", dlocktest.Image{Kind: "MyDB", Context: good, Port: 1, Ping: ping}},
		{"leading digit", dlocktest.Image{Kind: "1db", Context: good, Port: 1, Ping: ping}},
		{"slash", dlocktest.Image{Kind: "my/db", Context: good, Port: 1, Ping: ping}},
		{"too long", dlocktest.Image{Kind: "a23456789012345678901234567890123", Context: good, Port: 1, Ping: ping}},
		{"built-in", dlocktest.Image{Kind: dlocktest.Redis, Context: good, Port: 1, Ping: ping}},
		{"no context", dlocktest.Image{Kind: "refused-a", Port: 1, Ping: ping}},
		{"no Dockerfile", dlocktest.Image{Kind: "refused-b", Context: fstest.MapFS{"x": {}}, Port: 1, Ping: ping}},
		{"port 0", dlocktest.Image{Kind: "refused-c", Context: good, Ping: ping}},
		{"port 65536", dlocktest.Image{Kind: "refused-d", Context: good, Port: 65536, Ping: ping}},
		{"no ping", dlocktest.Image{Kind: "refused-e", Context: good, Port: 1}},
	} {
		if err := dlocktest.Register(tc.img); !errors.Is(err, dlocktest.ErrInvalidImage) {
			t.Errorf("%s: Register = %v, want ErrInvalidImage", tc.name, err)
		}
		if tc.img.Kind == "" || tc.img.Kind == dlocktest.Redis {
			continue
		}
		if _, err := dlocktest.Start(t.Context(), tc.img.Kind, nil); !errors.Is(err, dlocktest.ErrUnknownKind) {
			t.Errorf("%s: Start after a refused Register = %v, want ErrUnknownKind", tc.name, err)
		}
	}
	if err := registerEcho(); err != nil {
		t.Fatal(err)
	}
	again := dlocktest.Image{Kind: echo, Context: good, Port: 1, Ping: ping}
	if err := dlocktest.Register(again); !errors.Is(err, dlocktest.ErrInvalidImage) {
		t.Errorf("registering %q twice: %v, want ErrInvalidImage", echo, err)
	}
}

// TestRegisteredKind proves that a registered kind is built from its
// context and served like a built-in one: started on 127.0.0.1, its Ping
// used for readiness and Server.Ping, paused, restarted at the same
// address, shared, and pointed at an external server by its variable.
func TestRegisteredKind(t *testing.T) {
	if err := registerEcho(); err != nil {
		t.Fatal(err)
	}
	s := dlocktest.RequireNew(t, echo)
	if s.Kind() != echo {
		t.Errorf("Kind() = %q, want %q", s.Kind(), echo)
	}
	if host, _, err := net.SplitHostPort(s.Addr()); err != nil || host != "127.0.0.1" {
		t.Errorf("Addr() = %q, want 127.0.0.1:<port>", s.Addr())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := pingEcho(ctx, s.Addr()); err != nil {
		t.Fatalf("the test's own echo after Start: %v", err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	err := s.Ping(short)
	cancelShort()
	if err == nil {
		t.Error("Server.Ping answered while the server was paused: it is not the kind's Ping")
	}
	if err := s.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Server.Ping after Unpause: %v", err)
	}
	addr := s.Addr()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("Addr() after Restart = %q, want %q", s.Addr(), addr)
	}
	if err := pingEcho(ctx, s.Addr()); err != nil {
		t.Errorf("the test's own echo after Restart: %v", err)
	}
	if a, b := dlocktest.Require(t, echo), dlocktest.Require(t, echo); a != b || a == s {
		t.Errorf("Require twice: %v and %v, want one shared server other than the test's own %v", a, b, s)
	}

	// DLOCK_ECHO_TEST_ADDR ('-' read as '_') points the kind at a server
	// already running: this one.
	t.Setenv("DLOCK_ECHO_TEST_ADDR", s.Addr())
	ext, err := dlocktest.Start(ctx, echo, nil)
	if err != nil {
		t.Fatalf("Start with DLOCK_ECHO_TEST_ADDR set: %v", err)
	}
	if !ext.External() || ext.Addr() != s.Addr() {
		t.Errorf("Start with DLOCK_ECHO_TEST_ADDR set: %v, want the external server at %s", ext, s.Addr())
	}
}

// TestBuildImagesRegistered proves that BuildImages builds a registered
// kind when it is named, and refuses an unknown one before any build.
func TestBuildImagesRegistered(t *testing.T) {
	if err := registerEcho(); err != nil {
		t.Fatal(err)
	}
	if err := dlocktest.BuildImages(t.Context(), echo, "no-such-kind"); !errors.Is(err, dlocktest.ErrUnknownKind) {
		t.Errorf("BuildImages with an unknown kind: %v, want ErrUnknownKind", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := dlocktest.BuildImages(ctx, echo); err != nil {
		if errors.Is(err, dlocktest.ErrNoDocker) && os.Getenv(dlocktest.RequireBackendsEnv) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
}
