package zookeeper

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	ibackoff "github.com/dlock/dlock/internal/backoff"

	"github.com/go-zookeeper/zk"
)

// do runs f, one call on the connection, bounded by ctx: when ctx ends first
// do returns ctx's error, and f's own result goes to late (if not nil) when
// it comes. go-zookeeper's calls take no context; each ends when the server
// answers or the connection fails or closes.
func (s *session) do(ctx context.Context, f func() error, late func(error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	for s.unsettled != nil && !s.closing {
		wait := s.unsettled
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.dialCtx.Done():
		}
		s.mu.Lock()
	}
	if s.closing {
		s.mu.Unlock()
		return zk.ErrClosing
	}
	s.calls.Add(1)
	s.mu.Unlock()
	if ctx.Done() == nil {
		defer s.calls.Done()
		return f()
	}
	var (
		mu        sync.Mutex
		abandoned bool
	)
	done := make(chan error, 1)
	go func() {
		defer s.calls.Done()
		err := f()
		mu.Lock()
		if !abandoned {
			done <- err
			mu.Unlock()
			return
		}
		mu.Unlock()
		if late != nil {
			late(err)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case err := <-done:
			return err
		default:
		}
		abandoned = true
		return ctx.Err()
	}
}

// transient reports whether err is connection or session trouble that a
// retry may get past.
func transient(err error) bool {
	return inDoubt(err) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrSessionMoved) ||
		errors.Is(err, errNoSession)
}

// inDoubt reports whether err leaves a request's outcome unknown: the
// connection failed with the request sent, or perhaps sent. go-zookeeper
// reports zk.ErrConnectionClosed for requests in flight when a connection
// ends, and the socket's own error when writing the request failed. Errors
// the server answered with, and zk.ErrNoServer (requests that never left),
// are not in doubt.
func inDoubt(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // context.DeadlineExceeded is a net.Error too
	}
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// backoff is the driver's delay between retries: internal/backoff's, from
// 10ms to 1s. Its zero value is ready (the driver's loops declare it and
// reset it with backoff{}).
type backoff struct{ b ibackoff.Backoff }

// sleep waits for the next delay; it returns false if ctx ended first. It
// also returns early when wake (if not nil) is closed.
func (b *backoff) sleep(ctx context.Context, wake <-chan struct{}) bool {
	if b.b.Max == 0 {
		b.b = ibackoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	}
	t := time.NewTimer(b.b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C:
	}
	return true
}
