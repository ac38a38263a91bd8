package dlocktest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// baseImage is the FROM of every Dockerfile; it is never pulled.
const baseImage = "debian:bookworm-slim"

// dockerEngine is the process's connection to Docker: a dockertest Pool.
type dockerEngine struct {
	pool *dockertest.Pool
}

var (
	engineMu     sync.Mutex
	engineCached *dockerEngine

	// buildSem serialises image builds within the process.
	buildSem = make(chan struct{}, 1)
)

// engine returns the process's Docker connection, made on first use (from
// DOCKER_HOST, or the default socket) and checked with a ping; ctx bounds
// the ping. Failures wrap ErrNoDocker and are not remembered. A new
// connection first reaps the leftovers of dead processes.
func engine(ctx context.Context) (*dockerEngine, error) {
	engineMu.Lock()
	defer engineMu.Unlock()
	if engineCached != nil {
		return engineCached, nil
	}
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(pctx); err != nil {
		pool.Client.HTTPClient.CloseIdleConnections()
		return nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	e := &dockerEngine{pool: pool}
	e.reap(pctx)
	engineCached = e
	return e, nil
}

// closeIdle drops the kept-alive connections to the engine.
func closeIdle() {
	engineMu.Lock()
	defer engineMu.Unlock()
	if engineCached != nil {
		engineCached.pool.Client.HTTPClient.CloseIdleConnections()
	}
}

//go:embed images
var images embed.FS

// imageContext returns the build context of kind and its tag,
// dlock-<kind>:<first 12 hex digits of the SHA-256 over the context's file
// names and contents> (the context is normally just the Dockerfile).
func imageContext(kind Kind) (fs.FS, string, error) {
	sp, err := spec(kind)
	if err != nil {
		return nil, "", err
	}
	sub, err := sp.context()
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
// the tag. Builds within the process take turns.
func (e *dockerEngine) ensureImage(ctx context.Context, kind Kind) (string, error) {
	select {
	case buildSem <- struct{}{}:
		defer func() { <-buildSem }()
	case <-ctx.Done():
		return "", fmt.Errorf("dlocktest: waiting to build the %s image: %w", kind, ctx.Err())
	}
	return e.buildMissing(ctx, kind)
}

// buildMissing builds kind's image unless its tag already exists, and
// returns the tag.
func (e *dockerEngine) buildMissing(ctx context.Context, kind Kind) (string, error) {
	ctxFS, tag, err := imageContext(kind)
	if err != nil {
		return "", fmt.Errorf("dlocktest: %s image context: %w", kind, err)
	}
	if ok, err := e.imageExists(tag); err != nil {
		return "", fmt.Errorf("dlocktest: inspecting %s: %w", tag, err)
	} else if ok {
		return tag, nil
	}
	if ok, err := e.imageExists(baseImage); err == nil && !ok {
		return "", fmt.Errorf("%w: base image %s is missing", ErrNoDocker, baseImage)
	}
	if out, err := e.build(ctx, ctxFS, tag, map[string]string{LabelKind: string(kind)}); err != nil {
		return "", fmt.Errorf("dlocktest: building %s: %w\n%s", tag, err, lastLines(out, 20))
	}
	return tag, nil
}

func (e *dockerEngine) imageExists(name string) (bool, error) {
	_, err := e.pool.Client.InspectImage(name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, dc.ErrNoSuchImage):
		return false, nil
	default:
		return false, err
	}
}

// build builds the image tag from the build context ctxFS with the classic
// builder, never pulling, and returns the build's output. A failed step is
// an error.
func (e *dockerEngine) build(ctx context.Context, ctxFS fs.FS, tag string, labels map[string]string) (string, error) {
	var buildCtx bytes.Buffer
	tw := tar.NewWriter(&buildCtx)
	if err := tw.AddFS(ctxFS); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	var out bytes.Buffer
	err := e.pool.Client.BuildImage(dc.BuildImageOptions{
		Name:                tag,
		Dockerfile:          "Dockerfile",
		InputStream:         &buildCtx,
		OutputStream:        &out,
		RmTmpContainer:      true,
		ForceRmTmpContainer: true,
		Labels:              labels,
		Version:             "1", // the classic builder: BuildKit may look the base up in a registry
		Context:             ctx,
	})
	return out.String(), err
}

// run creates and starts a container of the image, publishing the server's
// port on 127.0.0.1 at a free port it picks, and registers its Server.
//
// The container is made with the engine client of dockertest rather than
// Pool.RunWithOptions, which would publish every port on all interfaces,
// attach networks without aliases and pull a missing image.
func (e *dockerEngine) run(ctx context.Context, kind Kind, tag string, opts *StartOptions, ready time.Duration) (*Server, error) {
	sp, err := spec(kind)
	if err != nil {
		return nil, err
	}
	port := dc.Port(sp.port)
	var lastErr error
	for range 3 { // another process may take the port we picked before Docker binds it
		hostPort, err := freePort()
		if err != nil {
			return nil, err
		}
		name := ContainerPrefix + string(kind) + "-" + randomHex(4)
		hc := &dc.HostConfig{
			PortBindings: map[dc.Port][]dc.PortBinding{
				port: {{HostIP: "127.0.0.1", HostPort: strconv.Itoa(hostPort)}},
			},
			NetworkMode: opts.Network, // "": the default bridge
		}
		var nc *dc.NetworkingConfig
		if opts.Network != "" {
			ep := &dc.EndpointConfig{}
			if opts.Alias != "" {
				ep.Aliases = []string{opts.Alias}
			}
			nc = &dc.NetworkingConfig{EndpointsConfig: map[string]*dc.EndpointConfig{opts.Network: ep}}
		}
		c, err := e.pool.Client.CreateContainer(dc.CreateContainerOptions{
			Name: name,
			Config: &dc.Config{
				Image:        tag,
				Cmd:          opts.Cmd,
				Env:          opts.Env,
				ExposedPorts: map[dc.Port]struct{}{port: {}},
				Labels:       map[string]string{LabelKind: string(kind), LabelOwner: owner()},
			},
			HostConfig:       hc,
			NetworkingConfig: nc,
			Context:          ctx,
		})
		if err != nil {
			return nil, fmt.Errorf("dlocktest: creating %s container: %w", kind, err)
		}
		s := &Server{
			kind:        kind,
			addr:        net.JoinHostPort("127.0.0.1", strconv.Itoa(hostPort)),
			containerID: c.ID,
			name:        name,
			ready:       ready,
		}
		registryMu.Lock()
		registry[s] = struct{}{}
		registryMu.Unlock()

		err = e.pool.Client.StartContainerWithContext(c.ID, nil, ctx)
		if err == nil {
			return s, nil
		}
		lastErr = fmt.Errorf("dlocktest: starting %s: %w", s, err)
		if cerr := s.Close(); cerr != nil {
			return nil, errors.Join(lastErr, cerr)
		}
		if !isPortConflict(err) || ctx.Err() != nil {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

func isPortConflict(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "port is already allocated") || strings.Contains(msg, "address already in use")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("dlocktest: picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// state reports whether the container is running, and its exit code if not.
func (e *dockerEngine) state(ctx context.Context, id string) (running bool, exitCode int, err error) {
	c, err := e.pool.Client.InspectContainerWithContext(id, ctx)
	if err != nil {
		return false, 0, err
	}
	return c.State.Running, c.State.ExitCode, nil
}

// logs returns the last tail lines the container wrote to stdout and
// stderr, or why they could not be read.
func (e *dockerEngine) logs(ctx context.Context, id string, tail int) string {
	var out bytes.Buffer
	err := e.pool.Client.Logs(dc.LogsOptions{
		Context: ctx, Container: id, OutputStream: &out, ErrorStream: &out,
		Stdout: true, Stderr: true, Tail: strconv.Itoa(tail),
	})
	if err != nil {
		fmt.Fprintf(&out, "(reading the logs: %v)", err)
	}
	return lastLines(out.String(), tail)
}

// remove removes a container, running or not, with its anonymous volumes;
// one that does not exist is not an error.
func (e *dockerEngine) remove(ctx context.Context, id string) error {
	err := e.pool.Client.RemoveContainer(dc.RemoveContainerOptions{ID: id, Force: true, RemoveVolumes: true, Context: ctx})
	if _, gone := errors.AsType[*dc.NoSuchContainer](err); gone {
		return nil
	}
	return err
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

// orphaned reports whether labels name a process on this host (and pid
// namespace) that no longer runs.
func orphaned(labels map[string]string) bool {
	pid, ok := strings.CutPrefix(labels[LabelOwner], ownerPrefix())
	n, err := strconv.Atoi(pid)
	return ok && err == nil && !processAlive(n)
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

// reap removes, best effort, the containers and then the networks left by
// processes on this host that died without closing them: a test binary
// killed by -timeout, say.
func (e *dockerEngine) reap(ctx context.Context) {
	list, err := e.pool.Client.ListContainers(dc.ListContainersOptions{
		All: true, Filters: map[string][]string{"label": {LabelOwner}}, Context: ctx,
	})
	if err == nil {
		for _, c := range list {
			if orphaned(c.Labels) {
				_ = e.remove(ctx, c.ID)
			}
		}
	}
	nets, err := e.pool.Client.FilteredListNetworks(dc.NetworkFilterOpts{"label": {LabelOwner: true}})
	if err != nil {
		return
	}
	for _, n := range nets {
		if orphaned(n.Labels) && ctx.Err() == nil {
			_ = e.pool.Client.RemoveNetwork(n.ID) // one still in use is left for later
		}
	}
}

// Fault injection. Each engine call of a fault is retried a few times when
// the engine fails it with a server error, which on a loaded machine is
// often transient ("OCI runtime pause failed: unable to freeze"); an error
// that remains wraps ErrFault.

// faultAttempts bounds the tries of one engine call of a fault.
const faultAttempts = 5

// retryFault runs call until it succeeds, fails with an error that is not
// the engine's 500, or has been tried faultAttempts times, backing off from
// 50ms; ctx bounds the waits.
func retryFault(ctx context.Context, call func() error) error {
	backoff := 50 * time.Millisecond
	var err error
	for attempt := 1; ; attempt++ {
		if err = call(); err == nil {
			return nil
		}
		if !transient(err) || attempt == faultAttempts {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w (then %w)", ErrFault, err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
	if transient(err) {
		return fmt.Errorf("%w after %d attempts: %w", ErrFault, faultAttempts, err)
	}
	return fmt.Errorf("%w: %w", ErrFault, err)
}

// transient reports whether err is the engine's 500 Internal Server Error
// other than one about the container's state (older engines answer "is not
// paused" or "is not running" with 500, not 409).
func transient(err error) bool {
	de, ok := errors.AsType[*dc.Error](err)
	return ok && de.Status == http.StatusInternalServerError &&
		!strings.Contains(de.Message, "not paused") && !strings.Contains(de.Message, "already paused") &&
		!strings.Contains(de.Message, "not running")
}

// withCtx runs call, an engine call that takes no ctx, and returns its
// error, or ctx's if ctx ends first; call then finishes on its own.
func withCtx(ctx context.Context, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *dockerEngine) pause(ctx context.Context, id string) error {
	return retryFault(ctx, func() error {
		return withCtx(ctx, func() error { return e.pool.Client.PauseContainer(id) })
	})
}

// unpause resumes a paused container; notPaused reports an engine error
// saying it was not paused.
func (e *dockerEngine) unpause(ctx context.Context, id string) error {
	return retryFault(ctx, func() error {
		return withCtx(ctx, func() error { return e.pool.Client.UnpauseContainer(id) })
	})
}

func notPaused(err error) bool { return err != nil && strings.Contains(err.Error(), "not paused") }

// kill kills a running container with SIGKILL and waits until it is down; a
// paused one is resumed after the signal so that it dies. One already down is
// not an error.
func (e *dockerEngine) kill(ctx context.Context, id string) error {
	c, err := e.pool.Client.InspectContainerWithContext(id, ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFault, err)
	}
	if !c.State.Running {
		return nil
	}
	err = retryFault(ctx, func() error {
		err := e.pool.Client.KillContainer(dc.KillContainerOptions{ID: id, Signal: dc.SIGKILL, Context: ctx})
		if _, stopped := errors.AsType[*dc.ContainerNotRunning](err); stopped {
			return nil // it stopped in the meantime
		}
		return err
	})
	if err != nil {
		return err
	}
	if c.State.Paused {
		// Killing a paused container may unpause it; the engine then says
		// "is not paused".
		if err := e.unpause(ctx, id); err != nil && !notPaused(err) {
			return err
		}
	}
	if _, err := e.pool.Client.WaitContainerWithContext(id, ctx); err != nil {
		return fmt.Errorf("%w: waiting for it to stop: %w", ErrFault, err)
	}
	return nil
}

// start starts a stopped container; one already running is not an error.
func (e *dockerEngine) start(ctx context.Context, id string) error {
	return retryFault(ctx, func() error {
		err := e.pool.Client.StartContainerWithContext(id, nil, ctx)
		if _, running := errors.AsType[*dc.ContainerAlreadyRunning](err); running {
			return nil
		}
		return err
	})
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

// BuildImages builds, all at once, the images of the given kinds (every kind
// of Kinds when none is given; registered kinds only when named) that are not built yet. Start builds a missing image
// itself, one at a time; a test run calls BuildImages first so that the
// builds, which install each server from Debian's mirror (a minute or more
// each on a fresh machine), overlap one another and whatever else it does
// meanwhile. Building an image that exists costs one inspect.
func BuildImages(ctx context.Context, kinds ...Kind) error {
	if len(kinds) == 0 {
		kinds = Kinds
	}
	for _, kind := range kinds {
		if _, err := spec(kind); err != nil {
			return err
		}
	}
	e, err := engine(ctx)
	if err != nil {
		return err
	}
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, kind := range kinds {
		wg.Go(func() { _, errs[i] = e.buildMissing(ctx, kind) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
