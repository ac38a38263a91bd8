// Package servers runs throwaway backend servers (Redis, etcd, ZooKeeper,
// PostgreSQL) in Docker for dlock's tests, benchmarks and CLI, and can break
// them on purpose: pause, kill, start again.
//
// Each kind is built from a small Dockerfile on debian:bookworm-slim embedded
// in this package (images/<kind>/Dockerfile), tagged dlock-<kind>:<short hash
// of its build context> so that a build happens once per machine and again only
// when the Dockerfile changes. Nothing is pulled: the base image comes from
// scripts/docker-setup.sh, which installs and starts Docker when needed.
//
// A container is named dlock-test-<kind>-<random>, labelled with
// [LabelKind] and [LabelOwner], and publishes its port on 127.0.0.1 only, at a
// host port chosen once, so that [Server.Addr] stays the same across
// [Server.Stop] and [Server.Start]. Containers are not created with Docker's
// auto-remove, which would delete them on the first kill; instead [Server.Close]
// and [CloseAll] remove them, and a process that died without doing so has its
// containers removed by the next process on the same host that starts one.
//
// # External servers
//
// When DLOCK_REDIS_ADDR, DLOCK_ETCD_ADDR, DLOCK_ZOOKEEPER_ADDR or
// DLOCK_POSTGRES_ADDR is set to a host:port, [Start] returns a [Server] for that
// address instead of starting a container, and its fault methods return
// [ErrNotControllable]. Tests write, delete and flush data freely: point these
// variables only at throwaway servers, never at one holding data you care
// about. An external PostgreSQL must accept [PostgresUser] with
// [PostgresPassword].
//
// # Tests
//
// Tests use [Require] (a server shared by the whole test binary) or
// [RequireNew] (a dedicated one, for tests that pause or kill it), and call
// [CloseAll] from TestMain. Without Docker those helpers skip the test, unless
// DLOCK_REQUIRE_BACKENDS=1, as set by scripts/test.sh and CI, makes them fail.
package servers

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Kind names a backend server.
type Kind string

// The kinds of server this package runs. Each value is also the name of the
// image's folder under images/.
const (
	Redis     Kind = "redis"
	Etcd      Kind = "etcd"
	ZooKeeper Kind = "zookeeper"
	Postgres  Kind = "postgres"
)

// Kinds lists every kind, in a fixed order.
var Kinds = []Kind{Redis, Etcd, ZooKeeper, Postgres}

// Credentials of the PostgreSQL servers this package starts; an external one
// (DLOCK_POSTGRES_ADDR) must accept them too.
const (
	PostgresUser     = "postgres"
	PostgresPassword = "postgres"
	PostgresDatabase = "postgres"
)

// Labels set on every container this package starts.
const (
	// LabelKind holds the server's Kind.
	LabelKind = "io.github.dlock.servers.kind"
	// LabelOwner holds "<hostname>/<pid namespace>/<pid>" of the process that
	// started it.
	LabelOwner = "io.github.dlock.servers.owner"
)

// ContainerPrefix begins the name of every container this package starts.
const ContainerPrefix = "dlock-test-"

// Errors.
var (
	// ErrNoDocker reports that the Docker engine cannot be reached or lacks the
	// base image; the wrapping error says why.
	ErrNoDocker = errors.New("servers: Docker is not usable (run scripts/docker-setup.sh)")

	// ErrNotControllable is returned by the fault methods of an external
	// server (one given by a DLOCK_<KIND>_ADDR variable), and by Start when it
	// is asked to configure one.
	ErrNotControllable = errors.New("servers: external server cannot be controlled")

	// ErrClosed is returned by the methods of a closed Server.
	ErrClosed = errors.New("servers: server is closed")
)

// StartOptions adjust a server started by Start. A nil *StartOptions means
// the defaults.
type StartOptions struct {
	// Cmd is appended to the server's command line. Default: nothing.
	//   redis:     redis-server options, e.g. "--maxmemory", "10mb"
	//   etcd:      etcd flags the image does not set through ETCD_* (etcd
	//              exits when a flag shadows a set variable: use Env for
	//              those), e.g. "--heartbeat-interval=50", "--election-timeout=500"
	//   zookeeper: extra zoo.cfg lines, e.g. "tickTime=200"
	//   postgres:  postgres options, e.g. "-c", "max_connections=20"
	Cmd []string

	// Env adds KEY=value variables to the container. Default: none. etcd reads
	// its base configuration from ETCD_* variables (see its Dockerfile), which
	// these override; ZooKeeper takes JVM options from JVMFLAGS.
	Env []string

	// ReadyTimeout bounds the wait for the server to answer after it is
	// started (not the image build). Default: 60s.
	ReadyTimeout time.Duration

	// Network attaches the container to a Docker network made by NewNetwork
	// (its Name) instead of Docker's default bridge, so that the servers on
	// it reach each other by Alias, as the members of one cluster do. The
	// client port is still published on 127.0.0.1 only. Default: none.
	Network string

	// Alias is the container's host name on Network. Default: none.
	Alias string
}

const (
	defaultReadyTimeout = 60 * time.Second
	// pingTimeout bounds one readiness probe.
	pingTimeout = 2 * time.Second
	// cleanupTimeout bounds the Docker calls of Close, which takes no ctx.
	cleanupTimeout = 30 * time.Second
	// baseImage is the FROM of every Dockerfile; scripts/docker-setup.sh makes it.
	baseImage = "debian:bookworm-slim"
)

// Server is a running (or stopped, or paused) backend server. Its methods are
// safe for concurrent use.
type Server struct {
	kind        Kind
	addr        string // 127.0.0.1:port, or the external host:port
	external    bool
	containerID string
	name        string
	ready       time.Duration // ReadyTimeout

	mu     sync.Mutex // serialises the fault methods and Close
	closed bool
}

// Kind reports which backend the server runs.
func (s *Server) Kind() Kind { return s.kind }

// Addr is the host:port clients dial: 127.0.0.1:<port> for a server this
// package started, the same across Stop and Start.
func (s *Server) Addr() string { return s.addr }

// External reports whether the server was given by a DLOCK_<KIND>_ADDR
// variable rather than started here.
func (s *Server) External() bool { return s.external }

// String describes the server for logs.
func (s *Server) String() string {
	if s.external {
		return fmt.Sprintf("external %s at %s", s.kind, s.addr)
	}
	return fmt.Sprintf("%s at %s (container %s)", s.kind, s.addr, s.name)
}

// Start runs a new server of the given kind and returns once it answers its
// protocol-level health check. ctx bounds the whole of it: building the image
// on first use (minutes for ZooKeeper), starting the container and waiting
// for it; opts.ReadyTimeout bounds the wait alone. When DLOCK_<KIND>_ADDR is
// set, Start returns that external server after checking that it answers.
//
// The caller owns the server and must Close it; CloseAll closes every server
// this process started.
func Start(ctx context.Context, kind Kind, opts *StartOptions) (*Server, error) {
	if !slices.Contains(Kinds, kind) {
		return nil, fmt.Errorf("servers: unknown kind %q (known: %v)", kind, Kinds)
	}
	if opts == nil {
		opts = &StartOptions{}
	}
	ready := opts.ReadyTimeout
	if ready <= 0 {
		ready = defaultReadyTimeout
	}
	if addr, ok, err := externalAddr(kind); err != nil {
		return nil, err
	} else if ok {
		if len(opts.Cmd) > 0 || len(opts.Env) > 0 || opts.Network != "" {
			return nil, fmt.Errorf("%w: %s comes from %s, so Cmd, Env and Network cannot be applied", ErrNotControllable, kind, envVar(kind))
		}
		s := &Server{kind: kind, addr: addr, external: true, ready: ready}
		if err := s.waitReady(ctx); err != nil {
			return nil, err
		}
		return s, nil
	}

	client, err := dockerClient(ctx)
	if err != nil {
		return nil, err
	}
	tag, err := ensureImage(ctx, client, kind)
	if err != nil {
		return nil, err
	}
	s, err := runContainer(ctx, client, kind, tag, opts, ready)
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// envVar names the variable that points kind at an external server.
func envVar(kind Kind) string { return "DLOCK_" + strings.ToUpper(string(kind)) + "_ADDR" }

// externalAddr reads DLOCK_<KIND>_ADDR. The value is not echoed in errors:
// it might be a URL carrying a password.
func externalAddr(kind Kind) (addr string, ok bool, err error) {
	v := strings.TrimSpace(os.Getenv(envVar(kind)))
	if v == "" {
		return "", false, nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || port == "" || strings.ContainsAny(v, "@/") {
		return "", false, fmt.Errorf("servers: %s must be host:port", envVar(kind))
	}
	return v, true, nil
}

// The process-wide state: one Docker client, every server started, and the
// shared ones.
var (
	dockerMu     sync.Mutex
	dockerCached *docker

	registryMu sync.Mutex
	registry   = map[*Server]struct{}{}
	shared     = map[Kind]*sharedEntry{}

	// buildSem serialises image builds within the process.
	buildSem = make(chan struct{}, 1)
)

type sharedEntry struct {
	done chan struct{} // closed when srv, err are set
	srv  *Server
	err  error
}

// Shared returns this process's server of the given kind, starting it on the
// first call; later and concurrent calls get the same server, or the same
// error, unless the first call was cut short by its ctx, in which case the
// next call tries again. ctx bounds this call's start or wait.
//
// A shared server belongs to everyone in the process: do not pause, stop or
// close it (use Start for that). CloseAll closes it.
func Shared(ctx context.Context, kind Kind) (*Server, error) {
	for {
		registryMu.Lock()
		e, ok := shared[kind]
		if !ok {
			e = &sharedEntry{done: make(chan struct{})}
			shared[kind] = e
			registryMu.Unlock()

			e.srv, e.err = Start(ctx, kind, nil)
			if e.err != nil && ctx.Err() != nil {
				registryMu.Lock()
				delete(shared, kind)
				registryMu.Unlock()
			}
			close(e.done)
			return e.srv, e.err
		}
		registryMu.Unlock()

		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("servers: waiting for the shared %s: %w", kind, ctx.Err())
		}
		registryMu.Lock()
		retry := e.err != nil && shared[kind] != e // the starter gave up: try ourselves
		registryMu.Unlock()
		if !retry {
			return e.srv, e.err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("servers: waiting for the shared %s: %w", kind, err)
		}
	}
}

// CloseAll closes every server this process started, shared or not, and
// releases the Docker client's idle connections. Call it from TestMain and
// before the CLI exits; servers may be started again afterwards.
func CloseAll() error {
	registryMu.Lock()
	all := make([]*Server, 0, len(registry))
	for s := range registry {
		all = append(all, s)
	}
	clear(shared)
	registryMu.Unlock()

	var errs []error
	for _, s := range all {
		errs = append(errs, s.Close())
	}
	dockerMu.Lock()
	if dockerCached != nil {
		dockerCached.closeIdle()
	}
	dockerMu.Unlock()
	return errors.Join(errs...)
}

// dockerClient returns the process's Docker client, connecting on first use.
// Failures wrap ErrNoDocker and are not remembered.
func dockerClient(ctx context.Context) (*docker, error) {
	dockerMu.Lock()
	defer dockerMu.Unlock()
	if dockerCached != nil {
		return dockerCached, nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err := newDocker(pctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	reapOrphans(pctx, client)
	dockerCached = client
	return dockerCached, nil
}

// owner identifies this process in LabelOwner.
func owner() string { return ownerPrefix() + strconv.Itoa(os.Getpid()) }

// ownerPrefix is "<hostname>/<pid namespace>/": processes with the same prefix
// see each other's pids. The namespace is empty off Linux.
func ownerPrefix() string {
	host, _ := os.Hostname()
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return host + "/" + strings.ReplaceAll(ns, "/", "_") + "/"
}

// reapOrphans removes, best effort, the containers left by processes on this
// host (and pid namespace) that died without closing them: a test binary
// killed by -timeout, say.
func reapOrphans(ctx context.Context, client *docker) {
	prefix := ownerPrefix()
	list, err := client.listContainers(ctx, LabelOwner)
	if err != nil {
		return
	}
	for _, c := range list {
		pid, ok := strings.CutPrefix(c.Labels[LabelOwner], prefix)
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || processAlive(n) {
			continue
		}
		_ = client.removeContainer(ctx, c.ID)
	}
}

// processAlive reports whether a process with that pid exists; when in doubt,
// it says yes.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	defer p.Release()
	return !errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}

//go:embed images
var images embed.FS

// imageContext returns the build context of kind and its tag,
// dlock-<kind>:<first 12 hex digits of the SHA-256 over the context's file
// names and contents> (the context is normally just the Dockerfile).
func imageContext(kind Kind) (fs.FS, string, error) {
	sub, err := fs.Sub(images, path.Join("images", string(kind)))
	if err != nil {
		return nil, "", err
	}
	h := sha256.New()
	err = fs.WalkDir(sub, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return sub, fmt.Sprintf("dlock-%s:%s", kind, hex.EncodeToString(h.Sum(nil))[:12]), nil
}

// ensureImage builds kind's image unless its tag already exists, and returns
// the tag.
func ensureImage(ctx context.Context, client *docker, kind Kind) (string, error) {
	ctxFS, tag, err := imageContext(kind)
	if err != nil {
		return "", fmt.Errorf("servers: %s image context: %w", kind, err)
	}
	select {
	case buildSem <- struct{}{}:
		defer func() { <-buildSem }()
	case <-ctx.Done():
		return "", fmt.Errorf("servers: waiting to build %s: %w", tag, ctx.Err())
	}
	if ok, err := client.imageExists(ctx, tag); err != nil {
		return "", fmt.Errorf("servers: inspecting %s: %w", tag, err)
	} else if ok {
		return tag, nil
	}
	if ok, err := client.imageExists(ctx, baseImage); err == nil && !ok {
		return "", fmt.Errorf("%w: base image %s is missing", ErrNoDocker, baseImage)
	}

	var buildCtx bytes.Buffer
	tw := tar.NewWriter(&buildCtx)
	if err := tw.AddFS(ctxFS); err != nil {
		return "", fmt.Errorf("servers: %s build context: %w", kind, err)
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("servers: %s build context: %w", kind, err)
	}
	out, err := client.buildImage(ctx, tag, map[string]string{LabelKind: string(kind)}, &buildCtx)
	if err != nil {
		return "", fmt.Errorf("servers: building %s: %w\n%s", tag, err, lastLines(out, 20))
	}
	return tag, nil
}

// runContainer creates and starts a container of the image, publishing the
// server's port on 127.0.0.1 at a free port it picks.
func runContainer(ctx context.Context, client *docker, kind Kind, tag string, opts *StartOptions, ready time.Duration) (*Server, error) {
	port := containerPort(kind)
	var lastErr error
	for range 3 { // another process may take the port we picked before Docker binds it
		hostPort, err := freePort()
		if err != nil {
			return nil, err
		}
		name := ContainerPrefix + string(kind) + "-" + randomHex(4)
		id, err := client.createContainer(ctx, name, &containerSpec{
			Image:        tag,
			Cmd:          opts.Cmd,
			Env:          opts.Env,
			ExposedPorts: map[string]struct{}{port: {}},
			Labels:       map[string]string{LabelKind: string(kind), LabelOwner: owner()},
			HostConfig: hostConfig{
				PortBindings: map[string][]portBinding{
					port: {{HostIP: "127.0.0.1", HostPort: strconv.Itoa(hostPort)}},
				},
				NetworkMode: opts.Network, // "": the default bridge
			},
			NetworkingConfig: networking(opts),
		})
		if err != nil {
			return nil, fmt.Errorf("servers: creating %s container: %w", kind, err)
		}
		s := &Server{
			kind:        kind,
			addr:        net.JoinHostPort("127.0.0.1", strconv.Itoa(hostPort)),
			containerID: id,
			name:        name,
			ready:       ready,
		}
		registryMu.Lock()
		registry[s] = struct{}{}
		registryMu.Unlock()

		err = client.startContainer(ctx, id)
		if err == nil {
			return s, nil
		}
		lastErr = fmt.Errorf("servers: starting %s: %w", s, err)
		if cerr := s.Close(); cerr != nil {
			return nil, errors.Join(lastErr, cerr)
		}
		if !isPortConflict(err) || ctx.Err() != nil {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

// containerPort is the server's port inside its container, as Docker names
// it.
func containerPort(kind Kind) string {
	switch kind {
	case Etcd:
		return "2379/tcp"
	case ZooKeeper:
		return "2181/tcp"
	case Postgres:
		return "5432/tcp"
	default:
		return "6379/tcp"
	}
}

func isPortConflict(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "port is already allocated") || strings.Contains(msg, "address already in use")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("servers: picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// control returns the Docker client for a fault method, or why there is none.
// It is called with s.mu held.
func (s *Server) control(ctx context.Context, op string) (*docker, error) {
	switch {
	case s.external:
		return nil, fmt.Errorf("%w: cannot %s %s", ErrNotControllable, op, s)
	case s.closed:
		return nil, fmt.Errorf("%w: cannot %s %s", ErrClosed, op, s)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("servers: %s %s: %w", op, s, err)
	}
	return dockerClient(ctx)
}

// Pause freezes every process of the server (docker pause): connections stay
// open and TCP handshakes still complete, but nothing is answered until
// Unpause. ctx bounds the Docker call.
func (s *Server) Pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := s.control(ctx, "pause")
	if err != nil {
		return err
	}
	err = retryEngine(ctx, func() error { return client.pauseContainer(ctx, s.containerID) }, "already paused")
	if err != nil {
		return fmt.Errorf("servers: pausing %s: %w", s, err)
	}
	return nil
}

// Unpause resumes a paused server. ctx bounds the Docker call.
func (s *Server) Unpause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := s.control(ctx, "unpause")
	if err != nil {
		return err
	}
	err = retryEngine(ctx, func() error { return client.unpauseContainer(ctx, s.containerID) }, "is not paused")
	if err != nil {
		return fmt.Errorf("servers: unpausing %s: %w", s, err)
	}
	return nil
}

// engineTries bounds how often retryEngine makes a call.
const engineTries = 5

// retryEngine makes an engine call again, up to engineTries times in all
// with a doubling pause from 50ms, while the engine answers it with a
// server error (5xx): on a loaded machine the runtime's freezer can fail to
// freeze or thaw a container's cgroup in time ("OCI runtime pause failed:
// unable to freeze"), and the container is left as it was. A conflict (409)
// whose message contains done, after a failed try, means that try took
// effect after all: success. ctx bounds the whole.
func retryEngine(ctx context.Context, call func() error, done string) error {
	backoff := 50 * time.Millisecond
	var errs []error
	for try := 1; ; try++ {
		err := call()
		switch {
		case err == nil:
			return nil
		case try > 1 && hasStatus(err, http.StatusConflict) && strings.Contains(err.Error(), done):
			return nil
		}
		errs = append(errs, err)
		var ae *apiError
		if !errors.As(err, &ae) || ae.status < 500 || try == engineTries {
			if len(errs) > 1 {
				return fmt.Errorf("%d tries: %w", len(errs), errors.Join(errs...))
			}
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(append(errs, ctx.Err())...)
		case <-t.C:
		}
		backoff *= 2
	}
}

// Stop kills the server with SIGKILL, as a crash would, and returns once it
// is down; a paused server is resumed after the signal so that it dies.
// Data written to disk stays for Start. Stopping a stopped server is not an
// error. ctx bounds the Docker calls.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := s.control(ctx, "stop")
	if err != nil {
		return err
	}
	return s.stop(ctx, client)
}

func (s *Server) stop(ctx context.Context, client *docker) error {
	c, err := client.inspectContainer(ctx, s.containerID)
	if err != nil {
		return fmt.Errorf("servers: stopping %s: %w", s, err)
	}
	if !c.State.Running {
		return nil
	}
	// 409 Conflict: it stopped in the meantime.
	err = client.killContainer(ctx, s.containerID, "SIGKILL")
	if err != nil && !hasStatus(err, http.StatusConflict) {
		return fmt.Errorf("servers: killing %s: %w", s, err)
	}
	if c.State.Paused {
		// Killing a paused container may unpause it; the engine then says
		// "is not paused", with 409 or, before Docker 23, 500.
		if err := client.unpauseContainer(ctx, s.containerID); err != nil && !strings.Contains(err.Error(), "not paused") {
			return fmt.Errorf("servers: unpausing killed %s: %w", s, err)
		}
	}
	if err := client.waitContainer(ctx, s.containerID); err != nil {
		return fmt.Errorf("servers: waiting for %s to stop: %w", s, err)
	}
	return nil
}

// Start starts a stopped server again, at the same address, and waits until
// it answers, as the package-level Start does. Starting a running server only
// waits for it. ctx bounds the whole of it.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := s.control(ctx, "start")
	if err != nil {
		return err
	}
	return s.start(ctx, client)
}

func (s *Server) start(ctx context.Context, client *docker) error {
	if err := client.startContainer(ctx, s.containerID); err != nil { // running already: no error
		return fmt.Errorf("servers: starting %s: %w", s, err)
	}
	return s.waitReady(ctx)
}

// Restart kills the server and starts it again at the same address (Stop then
// Start), returning once it answers. ctx bounds the whole of it.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := s.control(ctx, "restart")
	if err != nil {
		return err
	}
	if err := s.stop(ctx, client); err != nil {
		return err
	}
	return s.start(ctx, client)
}

// Close removes the server's container and its data. It is idempotent, and a
// no-op for an external server. Close takes no ctx; its Docker calls are
// bounded by 30s.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.external {
		s.closed = true
		return nil
	}
	s.closed = true

	registryMu.Lock()
	delete(registry, s)
	for k, e := range shared {
		select {
		case <-e.done:
			if e.srv == s {
				delete(shared, k)
			}
		default: // still starting: not s
		}
	}
	registryMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	client, err := dockerClient(ctx)
	if err != nil {
		return fmt.Errorf("servers: removing %s: %w", s, err)
	}
	if err := client.removeContainer(ctx, s.containerID); err != nil { // gone already: no error
		return fmt.Errorf("servers: removing %s: %w", s, err)
	}
	return nil
}

// Ping runs the server's health check once: Redis PING, etcd GET /health,
// ZooKeeper ruok and isro, PostgreSQL a startup message (no password is sent;
// an authentication request means the server accepts connections). ctx
// bounds it; without a deadline a 2s one applies.
func (s *Server) Ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pingTimeout)
		defer cancel()
	}
	return ping(ctx, s.kind, s.addr)
}

// waitReady polls Ping with a short backoff until it succeeds, the container
// exits, ctx ends or s.ready passes.
func (s *Server) waitReady(ctx context.Context) error {
	timeout := s.ready
	if timeout <= 0 {
		timeout = defaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	for {
		pctx, pcancel := context.WithTimeout(ctx, pingTimeout)
		err := ping(pctx, s.kind, s.addr)
		pcancel()
		if err == nil {
			return nil
		}
		if s.containerID != "" {
			if exitErr := s.checkRunning(ctx); exitErr != nil {
				return exitErr
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("servers: %s did not answer within %v: %w (last probe: %v)", s, timeout, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// checkRunning returns an error with the container's last log lines if it
// is no longer running.
func (s *Server) checkRunning(ctx context.Context) error {
	client, err := dockerClient(ctx)
	if err != nil {
		return nil
	}
	c, err := client.inspectContainer(ctx, s.containerID)
	if err != nil || c.State.Running {
		return nil
	}
	logs, _ := client.containerLogs(ctx, s.containerID, 30)
	return fmt.Errorf("servers: %s exited with status %d; last log lines:\n%s", s, c.State.ExitCode, lastLines(logs, 30))
}

// ping runs kind's health check against addr once, bounded by ctx.
func ping(ctx context.Context, kind Kind, addr string) error {
	switch kind {
	case Etcd:
		return pingEtcd(ctx, addr)
	case ZooKeeper:
		if err := pingZooKeeper(ctx, addr, "ruok", "imok"); err != nil {
			return err
		}
		return pingZooKeeper(ctx, addr, "isro", "rw")
	case Postgres:
		return pingPostgres(ctx, addr)
	default:
		return pingRedis(ctx, addr)
	}
}

// dial connects to addr with ctx's deadline applied to the connection.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn, nil
}

func pingRedis(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("redis PING: %w", err)
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("redis PING: got %q, want +PONG", line)
	}
	return nil
}

func pingZooKeeper(ctx context.Context, addr, cmd, want string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, cmd); err != nil {
		return err
	}
	got, err := io.ReadAll(io.LimitReader(conn, 256))
	if err != nil {
		return fmt.Errorf("zookeeper %s: %w", cmd, err)
	}
	if g := strings.TrimSpace(string(got)); g != want {
		return fmt.Errorf("zookeeper %s: got %q, want %q", cmd, g, want)
	}
	return nil
}

func pingEtcd(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	// A transport of its own, without keep-alive or proxy: nothing outlives the
	// call.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return fmt.Errorf("etcd /health: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
		return fmt.Errorf("etcd /health: %s %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// pingPostgres sends a protocol 3.0 startup message and reads the first reply,
// as pg_isready does: an authentication request, or any error other than
// 57P03 (cannot_connect_now: starting up, shutting down, recovering), means
// the server accepts connections. It never sends a password.
func pingPostgres(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	params := "user\x00" + PostgresUser + "\x00database\x00" + PostgresDatabase + "\x00\x00"
	msg := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	msg = binary.BigEndian.AppendUint32(msg, 3<<16)
	msg = append(msg, params...)
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fmt.Errorf("postgres startup: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 64<<10 {
		return fmt.Errorf("postgres startup: bad message length %d", n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		return fmt.Errorf("postgres startup: %w", err)
	}
	switch hdr[0] {
	case 'R':
		return nil
	case 'E':
		var code, text string
		for f := range bytes.SplitSeq(body, []byte{0}) {
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case 'C':
				code = string(f[1:])
			case 'M':
				text = string(f[1:])
			}
		}
		if code == "57P03" {
			return fmt.Errorf("postgres: %s (%s)", text, code)
		}
		return nil
	default:
		return fmt.Errorf("postgres startup: unexpected message %q", hdr[0])
	}
}

// CPUTime is the CPU time the server's container has used since it
// started, from its cgroup (v1 cpuacct or v2 cpu.stat). It fails for an
// external server.
func (s *Server) CPUTime() (time.Duration, error) {
	if s.external || s.containerID == "" {
		return 0, fmt.Errorf("servers: %s: not a container of ours", s)
	}
	return containerCPU(s.containerID)
}

// containerCPU reads a container's CPU time from its cgroup.
func containerCPU(id string) (time.Duration, error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(ns), err
	}
	for _, dir := range []string{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope", "/sys/fs/cgroup/docker/" + id} {
		b, err := os.ReadFile(dir + "/cpu.stat")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("servers: no cgroup CPU accounting found for container %.12s", id)
}
