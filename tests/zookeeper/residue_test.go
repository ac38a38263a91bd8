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

func (h reconnecting) Residue(ctx context.Context, name string) ([]string, error) {
	left, err := h.ownServer.Residue(ctx, name)
	if err == nil || errors.Is(err, zk.ErrNoNode) {
		return left, err
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
