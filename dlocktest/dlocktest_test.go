package dlocktest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dc "github.com/ory/dockertest/v3/docker"
)

func TestMain(m *testing.M) { Main(m) }

// redisPing dials addr and sends PING, all within d; it is the test's own
// client, independent of the package's readiness probe.
func redisPing(addr string, d time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(line); got != "+PONG" {
		return errors.New("got " + got + ", want +PONG")
	}
	return nil
}

// TestStartEachKind proves that every kind builds, starts and answers its
// health check at a 127.0.0.1 address.
func TestStartEachKind(t *testing.T) {
	for _, kind := range Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			s := Require(t, kind)
			t.Logf("%s ready in %v", s, time.Since(start).Round(time.Millisecond))
			if got := s.Kind(); got != kind {
				t.Errorf("Kind() = %v, want %v", got, kind)
			}
			if host, _, err := net.SplitHostPort(s.Addr()); err != nil || (host != "127.0.0.1" && !s.External()) {
				t.Errorf("Addr() = %q, want 127.0.0.1:<port>", s.Addr())
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if err := s.Ping(ctx); err != nil {
				t.Errorf("Ping: %v", err)
			}
			if again := Require(t, kind); again != s {
				t.Errorf("second Require returned %v, want the shared %v", again, s)
			}
		})
	}
}

// TestRedisFaults proves the fault methods: a paused server accepts TCP but
// does not answer, an unpaused one does, and Stop/Start and Restart keep the
// address.
func TestRedisFaults(t *testing.T) {
	s := RequireNew(t, Redis)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	addr := s.Addr()
	if err := redisPing(addr, 5*time.Second); err != nil {
		t.Fatalf("PING before faults: %v", err)
	}
	c := inspect(t, s)
	if !strings.HasPrefix(c.Name, "/"+ContainerPrefix) || c.Config.Labels[LabelOwner] != owner() {
		t.Errorf("container %s has labels %v, want the %s prefix and owner %s", c.Name, c.Config.Labels, ContainerPrefix, owner())
	}
	if len(c.NetworkSettings.Ports) == 0 {
		t.Errorf("container %s publishes no port", c.Name)
	}
	for port, bindings := range c.NetworkSettings.Ports {
		for _, b := range bindings {
			if b.HostIP != "127.0.0.1" {
				t.Errorf("port %s is published on %s, want 127.0.0.1 only", port, b.HostIP)
			}
		}
	}

	if err := s.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	start := time.Now()
	err := redisPing(addr, 500*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("PING while paused: got %v after %v, want a timeout", err, time.Since(start))
	}
	if err := s.Unpause(ctx); err != nil {
		t.Fatalf("Unpause: %v", err)
	}
	if err := redisPing(addr, 5*time.Second); err != nil {
		t.Errorf("PING after Unpause: %v", err)
	}

	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := redisPing(addr, time.Second); err == nil {
		t.Errorf("PING after Stop succeeded, want an error")
	}
	if err := s.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if got := s.Addr(); got != addr {
		t.Errorf("Addr() after Start = %q, want %q", got, addr)
	}
	if err := redisPing(addr, 5*time.Second); err != nil {
		t.Errorf("PING after Start: %v", err)
	}

	// A paused server can be stopped too, and comes back by Restart.
	if err := s.Pause(ctx); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart of a paused server: %v", err)
	}
	if err := redisPing(addr, 5*time.Second); err != nil {
		t.Errorf("PING after Restart: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Pause(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Pause after Close: got %v, want ErrClosed", err)
	}
	if err := redisPing(addr, time.Second); err == nil {
		t.Errorf("PING after Close succeeded, want an error")
	}
}

// TestStartOptions proves that Cmd reaches the server, and that a server that
// exits at start is reported with its logs at once rather than after
// ReadyTimeout.
func TestStartOptions(t *testing.T) {
	s := RequireNewWith(t, Redis, &StartOptions{Cmd: []string{"--maxmemory", "12mb"}})
	conn, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "CONFIG GET maxmemory\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	var reply []string
	for range 5 { // *2, $9, maxmemory, $8, 12582912
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		reply = append(reply, strings.TrimSpace(line))
	}
	if got, want := reply[4], "12582912"; got != want {
		t.Errorf("maxmemory = %s (reply %q), want %s", got, reply, want)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	bad, err := Start(ctx, Redis, &StartOptions{Cmd: []string{"--no-such-option", "1"}, ReadyTimeout: 30 * time.Second})
	if err == nil {
		bad.Close()
		t.Fatalf("Start with a bad option: got nil error, want one")
	}
	if !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "no-such-option") || time.Since(start) > 20*time.Second {
		t.Errorf("Start with a bad option: got %v after %v, want a quick error quoting the server's log", err, time.Since(start))
	}
}

// TestExternal proves that DLOCK_<KIND>_ADDR yields an uncontrollable server
// without Docker, and that a malformed value is not echoed.
func TestExternal(t *testing.T) {
	backing := RequireNew(t, Redis)
	t.Setenv(envVar(Redis), backing.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s, err := Start(ctx, Redis, nil)
	if err != nil {
		t.Fatalf("Start with %s set: %v", envVar(Redis), err)
	}
	if !s.External() || s.Addr() != backing.Addr() {
		t.Errorf("got %v, want the external server at %s", s, backing.Addr())
	}
	for name, fault := range map[string]func(context.Context) error{
		"Pause": s.Pause, "Unpause": s.Unpause, "Stop": s.Stop, "Start": s.Start, "Restart": s.Restart,
	} {
		if err := fault(ctx); !errors.Is(err, ErrNotControllable) {
			t.Errorf("%s: got %v, want ErrNotControllable", name, err)
		}
	}
	if _, err := Start(ctx, Redis, &StartOptions{Cmd: []string{"--maxmemory", "1mb"}}); !errors.Is(err, ErrNotControllable) {
		t.Errorf("Start with Cmd on an external server: got %v, want ErrNotControllable", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := redisPing(backing.Addr(), 5*time.Second); err != nil {
		t.Errorf("Close of the external server touched it: %v", err)
	}

	const secret = "hunter2"
	t.Setenv(envVar(Postgres), "postgres://u:"+secret+"@127.0.0.1:5432/db")
	_, err = Start(ctx, Postgres, nil)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("Start with a URL in %s: got %v, want an error without the password", envVar(Postgres), err)
	}
}

// TestNoDocker proves that an unreachable engine is reported as ErrNoDocker,
// pointing at scripts/docker-setup.sh.
func TestNoDocker(t *testing.T) {
	engineMu.Lock()
	saved := engineCached
	engineCached = nil
	engineMu.Unlock()
	t.Cleanup(func() {
		engineMu.Lock()
		engineCached = saved
		engineMu.Unlock()
	})
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	t.Setenv(envVar(Redis), "")

	_, err := Start(t.Context(), Redis, nil)
	if !errors.Is(err, ErrNoDocker) || !strings.Contains(err.Error(), "scripts/docker-setup.sh") {
		t.Errorf("Start without Docker: got %v, want ErrNoDocker naming scripts/docker-setup.sh", err)
	}
}

// TestReapOrphans proves that containers of a dead process on this host are
// removed, and those of a live one are not.
func TestReapOrphans(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	e, err := engine(ctx)
	if err != nil {
		requireFailed(t, "Docker", err)
	}
	tag, err := e.ensureImage(ctx, Redis)
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	create := func(owner string) string {
		t.Helper()
		c, err := e.pool.Client.CreateContainer(dc.CreateContainerOptions{
			Name:   ContainerPrefix + "reap-" + randomHex(4),
			Config: &dc.Config{Image: tag, Labels: map[string]string{LabelOwner: owner}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.remove(context.Background(), c.ID) })
		return c.ID
	}
	orphan := create(ownerPrefix() + strconv.Itoa(dead.Process.Pid))
	mine := create(owner())

	e.reap(ctx)
	if _, err := e.pool.Client.InspectContainer(orphan); err == nil {
		t.Errorf("container of dead pid %d survived reap", dead.Process.Pid)
	}
	if _, err := e.pool.Client.InspectContainer(mine); err != nil {
		t.Errorf("container of this process: %v, want it kept", err)
	}
}

// TestUnknownKind proves that Start rejects a kind it does not know.
func TestUnknownKind(t *testing.T) {
	if _, err := Start(t.Context(), Kind("mysql"), nil); err == nil {
		t.Errorf("Start(mysql): got nil error, want one")
	}
}

// inspect returns the Docker view of s's container.
func inspect(t *testing.T, s *Server) *dc.Container {
	t.Helper()
	e, err := engine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.pool.Client.InspectContainerWithContext(s.ContainerID(), t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return c
}
