package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// reconnecting is a harness whose Residue, when the harness's own
// connection fails (it may still be reconnecting, or stuck, after the Chaos
// section restarted the server), asks again on a connection of its own.
// Residue's answer is then about the server, not about the harness's
// connection.
type reconnecting struct{ ownServer }

// ownWait bounds a Residue on the harness's own connection before one on a
// fresh connection is tried.
const ownWait = 2 * time.Second

func (h reconnecting) Residue(ctx context.Context, name string) ([]string, error) {
	// The harness's connection, given ownWait: go-zookeeper's calls take
	// no ctx, and one on a connection still reconnecting may wait past
	// the caller's whole ctx (busy run 30: the Chaos section's residue
	// check, its fresh connection left no time).
	type result struct {
		left []string
		err  error
	}
	own := make(chan result, 1)
	go func() {
		left, err := h.ownServer.Residue(ctx, name)
		own <- result{left, err}
	}()
	var err error
	select {
	case r := <-own:
		if r.err == nil || errors.Is(r.err, zk.ErrNoNode) {
			return r.left, r.err
		}
		err = r.err
	case <-time.After(ownWait):
		err = fmt.Errorf("the harness's connection did not answer within %v", ownWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c, _, cerr := zk.Connect([]string{h.addr}, 10*time.Second, zk.WithLogger(quiet))
	if cerr != nil {
		return nil, errors.Join(err, cerr)
	}
	defer c.Close()
	for c.State() != zk.StateHasSession {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w; and no session on a new connection: %w", err, ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	fresh := h.harness
	fresh.raw = c
	return fresh.Residue(ctx, name)
}
