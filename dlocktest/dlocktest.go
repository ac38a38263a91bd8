package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
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
	MariaDB   Kind = "mariadb"
)

// Kinds lists the kinds this package ships, in a fixed order. A
// third-party driver adds its own with Register.
var Kinds = []Kind{Redis, Etcd, ZooKeeper, Postgres, MariaDB}

// Credentials of the PostgreSQL servers this package starts; an external one
// (DLOCK_POSTGRES_ADDR) must accept them too.
const (
	PostgresUser     = "postgres"
	PostgresPassword = "postgres"
	PostgresDatabase = "postgres"
)

// Credentials of the MariaDB servers this package starts (the user owns the
// database, and may see and kill other sessions); an external one
// (DLOCK_MARIADB_ADDR) must accept them too. The servers offer TLS with a
// self-signed certificate for 127.0.0.1 and localhost, made when the image
// is built, and accept plain connections as well.
const (
	MariaDBUser     = "dlock"
	MariaDBPassword = "dlock"
	MariaDBDatabase = "dlock"
)

// Labels set on every container and network this package makes. Their
// values are those of dlock's earlier harness, so that each reaps the
// other's leftovers.
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
	ErrNoDocker = errors.New("dlocktest: Docker is not usable (dlock's scripts/docker-setup.sh sets it up)")

	// ErrNotControllable is returned by the fault methods of an external
	// server (one given by a DLOCK_<KIND>_ADDR variable), and by Start when it
	// is asked to configure one.
	ErrNotControllable = errors.New("dlocktest: external server cannot be controlled")

	// ErrClosed is returned by the methods of a closed Server.
	ErrClosed = errors.New("dlocktest: server is closed")

	// ErrFault is wrapped by the error of a fault method (Pause, Unpause,
	// Stop, Start, Restart) whose engine call still failed after its
	// retries: the harness could not inject the fault, which says nothing
	// about the backend or the driver under test.
	ErrFault = errors.New("dlocktest: the harness could not inject the fault")

	// ErrUnknownKind is returned by Start and BuildImages for a kind neither
	// in Kinds nor registered (Register), before any call to Docker.
	ErrUnknownKind = errors.New("dlocktest: unknown server kind")
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
	//   mariadb:   mariadbd options, e.g. "--max-connections=20"
	Cmd []string

	// Env adds KEY=value variables to the container. Default: none. etcd reads
	// its base configuration from ETCD_* variables (see its Dockerfile), which
	// these override; ZooKeeper takes JVM options from JVMFLAGS.
	Env []string

	// ReadyTimeout bounds the wait for the server to answer after it is
	// started (not the image build). Default: 60s.
	ReadyTimeout time.Duration

	// Network attaches the container to a network made by NewNetwork (its
	// Name) instead of Docker's default bridge, so that the servers on it
	// reach each other by Alias, as the members of one cluster do. The
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

// ContainerID is the Docker id of the server's container, "" for an
// external server.
func (s *Server) ContainerID() string { return s.containerID }

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
	if _, err := spec(kind); err != nil {
		return nil, err
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

	e, err := engine(ctx)
	if err != nil {
		return nil, err
	}
	tag, err := e.ensureImage(ctx, kind)
	if err != nil {
		return nil, err
	}
	s, err := e.run(ctx, kind, tag, opts, ready)
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// envVar names the variable that points kind at an external server.
func envVar(kind Kind) string {
	return "DLOCK_" + strings.ToUpper(strings.ReplaceAll(string(kind), "-", "_")) + "_ADDR"
}

// externalAddr reads DLOCK_<KIND>_ADDR. The value is not echoed in errors:
// it might be a URL carrying a password.
func externalAddr(kind Kind) (addr string, ok bool, err error) {
	v := strings.TrimSpace(os.Getenv(envVar(kind)))
	if v == "" {
		return "", false, nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || port == "" || strings.ContainsAny(v, "@/") {
		return "", false, fmt.Errorf("dlocktest: %s must be host:port", envVar(kind))
	}
	return v, true, nil
}

// The process-wide state: every server started, and the shared ones.
var (
	registryMu sync.Mutex
	registry   = map[*Server]struct{}{}
	shared     = map[Kind]*sharedEntry{}
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
			return nil, fmt.Errorf("dlocktest: waiting for the shared %s: %w", kind, ctx.Err())
		}
		registryMu.Lock()
		retry := e.err != nil && shared[kind] != e // the starter gave up: try ourselves
		registryMu.Unlock()
		if !retry {
			return e.srv, e.err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("dlocktest: waiting for the shared %s: %w", kind, err)
		}
	}
}

// CloseAll closes every server this process started, shared or not, and
// releases the Docker client's idle connections. Call it from TestMain (or
// use Main) and before a command exits; servers may be started again
// afterwards.
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
	closeIdle()
	return errors.Join(errs...)
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
	e, err := engine(ctx)
	if err != nil {
		return fmt.Errorf("dlocktest: removing %s: %w", s, err)
	}
	if err := e.remove(ctx, s.containerID); err != nil {
		return fmt.Errorf("dlocktest: removing %s: %w", s, err)
	}
	return nil
}

// Ping runs the server's health check once: Redis PING, etcd GET /health,
// ZooKeeper ruok and isro, PostgreSQL a startup message (no password is sent;
// an authentication request means the server accepts connections), MariaDB
// its greeting (read, never answered), a registered kind its Image.Ping.
// ctx bounds it; without a deadline a 2s one applies.
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
	var last error
	err := poll(ctx, func() error {
		pctx, pcancel := context.WithTimeout(ctx, pingTimeout)
		defer pcancel()
		if last = ping(pctx, s.kind, s.addr); last == nil {
			return nil
		}
		if s.containerID != "" {
			if exited := s.exited(ctx); exited != nil {
				return errStop{exited}
			}
		}
		return last
	})
	if stop, ok := errors.AsType[errStop](err); ok {
		return stop.err
	}
	if err != nil {
		return fmt.Errorf("dlocktest: %s did not answer within %v: %w", s, timeout, err)
	}
	return nil
}

// exited returns an error with the container's last log lines if it is no
// longer running, nil if it is or if that cannot be told.
func (s *Server) exited(ctx context.Context) error {
	e, err := engine(ctx)
	if err != nil {
		return nil
	}
	running, code, err := e.state(ctx, s.containerID)
	if err != nil || running {
		return nil
	}
	return fmt.Errorf("dlocktest: %s exited with status %d; last log lines:\n%s", s, code, e.logs(ctx, s.containerID, 30))
}

// errStop ends a poll at once with err.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// poll runs check until it succeeds, returns an errStop or ctx ends,
// backing off from 20ms to 500ms between tries, and returns its last error
// with ctx's.
func poll(ctx context.Context, check func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := check()
		if err == nil {
			return nil
		}
		if _, ok := errors.AsType[errStop](err); ok {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}
