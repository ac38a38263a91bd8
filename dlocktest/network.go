package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// NetworkPrefix begins the name of every Docker network this package makes.
const NetworkPrefix = "dlock-test-net-"

// Network is a Docker bridge network of its own, for servers that must reach
// each other, such as the members of a cluster: start them with
// StartOptions.Network set to its Name and an Alias each. Clients still
// reach every server only through its port published on 127.0.0.1.
type Network struct {
	net *dockertest.Network

	mu     sync.Mutex
	closed bool
}

// NewNetwork makes a network, labelled like the containers (LabelOwner), so
// that a process that dies without closing it has it removed by the next
// one that uses Docker. ctx bounds the Docker calls.
func NewNetwork(ctx context.Context) (*Network, error) {
	e, err := engine(ctx)
	if err != nil {
		return nil, err
	}
	name := NetworkPrefix + randomHex(4)
	n, err := e.pool.CreateNetwork(name, func(o *dc.CreateNetworkOptions) {
		o.Driver = "bridge"
		o.CheckDuplicate = true
		o.Labels = map[string]string{LabelOwner: owner()}
		o.Context = ctx
	})
	if err != nil {
		return nil, fmt.Errorf("dlocktest: creating network %s: %w", name, err)
	}
	return &Network{net: n}, nil
}

// Name is the value for StartOptions.Network.
func (n *Network) Name() string { return n.net.Network.Name }

// Close removes the network, disconnecting the servers still on it (close
// them first to remove them). It is idempotent; its Docker calls are bounded
// by 30s.
func (n *Network) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	e, err := engine(ctx)
	if err != nil {
		return fmt.Errorf("dlocktest: removing network %s: %w", n.Name(), err)
	}
	// dockertest disconnects the containers it knows of: those of now.
	if info, err := e.pool.Client.NetworkInfo(n.net.Network.ID); err == nil {
		n.net.Network = info
	}
	err = n.net.Close()
	if _, gone := errors.AsType[*dc.NoSuchNetwork](err); err != nil && !gone {
		return fmt.Errorf("dlocktest: removing network %s: %w", n.Name(), err)
	}
	return nil
}

// RequireNetwork makes a network for this test alone, removed by tb.Cleanup
// (register it before the servers on it, so that they are closed first). It
// skips and fails as Require does.
func RequireNetwork(tb TB) *Network {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), requireTimeout)
	defer cancel()
	n, err := NewNetwork(ctx)
	if err != nil {
		requireFailed(tb, "Docker network", err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	return n
}
