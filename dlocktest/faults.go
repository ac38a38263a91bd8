package dlocktest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// control returns the Docker engine for a fault method, or why there is
// none. It is called with s.mu held.
func (s *Server) control(ctx context.Context, op string) (*dockerEngine, error) {
	switch {
	case s.external:
		return nil, fmt.Errorf("%w: cannot %s %s", ErrNotControllable, op, s)
	case s.closed:
		return nil, fmt.Errorf("%w: cannot %s %s", ErrClosed, op, s)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dlocktest: %s %s: %w", op, s, err)
	}
	return engine(ctx)
}

// onContainer runs op (named in errors as verb, doing) on the server's
// container, with s.mu held.
func (s *Server) onContainer(ctx context.Context, verb, doing string, op func(*dockerEngine, context.Context, string) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.control(ctx, verb)
	if err != nil {
		return err
	}
	if err := op(e, ctx, s.containerID); err != nil {
		return fmt.Errorf("dlocktest: %s %s: %w", doing, s, err)
	}
	return nil
}

// Pause freezes every process of the server (docker pause): connections stay
// open and TCP handshakes still complete, but nothing is answered until
// Unpause. ctx bounds the Docker calls. An engine failure, retried a few
// times, wraps ErrFault.
func (s *Server) Pause(ctx context.Context) error {
	return s.onContainer(ctx, "pause", "pausing", (*dockerEngine).pause)
}

// Unpause resumes a paused server. ctx bounds the Docker calls.
func (s *Server) Unpause(ctx context.Context) error {
	return s.onContainer(ctx, "unpause", "unpausing", (*dockerEngine).unpause)
}

// Stop kills the server with SIGKILL, as a crash would, and returns once it
// is down; a paused server is resumed after the signal so that it dies.
// Data written to disk stays for Start. Stopping a stopped server is not an
// error. ctx bounds the Docker calls.
func (s *Server) Stop(ctx context.Context) error {
	return s.onContainer(ctx, "stop", "stopping", (*dockerEngine).kill)
}

// Start starts a stopped server again, at the same address, and waits until
// it answers, as the package-level Start does. Starting a running server only
// waits for it. ctx bounds the whole of it.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.control(ctx, "start")
	if err != nil {
		return err
	}
	return s.start(ctx, e)
}

func (s *Server) start(ctx context.Context, e *dockerEngine) error {
	if err := e.start(ctx, s.containerID); err != nil {
		return fmt.Errorf("dlocktest: starting %s: %w", s, err)
	}
	return s.waitReady(ctx)
}

// Restart kills the server and starts it again at the same address (Stop then
// Start), returning once it answers. ctx bounds the whole of it.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.control(ctx, "restart")
	if err != nil {
		return err
	}
	if err := e.kill(ctx, s.containerID); err != nil {
		return fmt.Errorf("dlocktest: restarting %s: %w", s, err)
	}
	return s.start(ctx, e) // its errors name the start
}

// PauseServer is Pause, as conformance.ServerFaults names it: a Harness
// that embeds *Server has the suite's server faults.
func (s *Server) PauseServer(ctx context.Context) error { return s.Pause(ctx) }

// ResumeServer is Unpause, as conformance.ServerFaults names it.
func (s *Server) ResumeServer(ctx context.Context) error { return s.Unpause(ctx) }

// RestartServer is Restart, as conformance.ServerFaults names it.
func (s *Server) RestartServer(ctx context.Context) error { return s.Restart(ctx) }

// CPUTime is the CPU time the server's container has used since it
// started, from its cgroup (v1 cpuacct or v2 cpu.stat). It fails for an
// external server.
func (s *Server) CPUTime() (time.Duration, error) {
	if s.external || s.containerID == "" {
		return 0, fmt.Errorf("dlocktest: %s: not a container of ours", s)
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
	return 0, fmt.Errorf("dlocktest: no cgroup CPU accounting found for container %.12s", id)
}

// Memory returns the memory the server's container uses now, as its cgroup
// counts it (page cache included), for benchmarks.
func (s *Server) Memory() (int64, error) {
	if s.external || s.containerID == "" {
		return 0, fmt.Errorf("dlocktest: %s: not a container of ours", s)
	}
	for _, f := range []string{
		"/sys/fs/cgroup/memory/docker/" + s.containerID + "/memory.usage_in_bytes",
		"/sys/fs/cgroup/system.slice/docker-" + s.containerID + ".scope/memory.current",
		"/sys/fs/cgroup/docker/" + s.containerID + "/memory.current",
	} {
		if b, err := os.ReadFile(f); err == nil {
			return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, fmt.Errorf("dlocktest: no cgroup memory accounting found for container %.12s", s.containerID)
}
