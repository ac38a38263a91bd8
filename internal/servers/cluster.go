package servers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// NetworkPrefix begins the name of every Docker network this package makes.
const NetworkPrefix = "dlock-test-net-"

// Network is a Docker bridge network of its own, for servers that must reach
// each other, such as the members of a cluster: start them with
// StartOptions.Network set to its Name and an Alias each. Clients still
// reach every server only through its port published on 127.0.0.1.
type Network struct {
	id, name string

	mu     sync.Mutex
	closed bool
}

// NewNetwork makes a network, labelled like the containers (LabelOwner), so
// that a process that dies without closing it has it removed by the next
// one that makes a network. ctx bounds the Docker calls.
func NewNetwork(ctx context.Context) (*Network, error) {
	client, err := dockerClient(ctx)
	if err != nil {
		return nil, err
	}
	reapNetworks(ctx, client)
	name := NetworkPrefix + randomHex(4)
	id, err := client.createNetwork(ctx, name, map[string]string{LabelOwner: owner()})
	if err != nil {
		return nil, fmt.Errorf("servers: creating network %s: %w", name, err)
	}
	return &Network{id: id, name: name}, nil
}

// Name is the value for StartOptions.Network.
func (n *Network) Name() string { return n.name }

// Close removes the network; close the servers on it first. It is
// idempotent; its Docker call is bounded by 30s.
func (n *Network) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	client, err := dockerClient(ctx)
	if err != nil {
		return fmt.Errorf("servers: removing network %s: %w", n.name, err)
	}
	if err := client.removeNetwork(ctx, n.id); err != nil { // gone already: no error
		return fmt.Errorf("servers: removing network %s: %w", n.name, err)
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
		if errors.Is(err, ErrNoDocker) && !backendsRequired() {
			tb.Skipf("no Docker network: %v", err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// networking attaches a container to opts.Network under opts.Alias.
func networking(opts *StartOptions) *networkingConfig {
	if opts.Network == "" {
		return nil
	}
	var ep endpointConfig
	if opts.Alias != "" {
		ep.Aliases = []string{opts.Alias}
	}
	return &networkingConfig{EndpointsConfig: map[string]endpointConfig{opts.Network: ep}}
}

// reapNetworks removes, best effort, the networks left by processes on this
// host (and pid namespace) that died without closing them; one that still
// has containers is left for later.
func reapNetworks(ctx context.Context, client *docker) {
	list, err := client.listNetworks(ctx, LabelOwner)
	if err != nil {
		return
	}
	prefix := ownerPrefix()
	for _, n := range list {
		pid, ok := strings.CutPrefix(n.Labels[LabelOwner], prefix)
		if !ok || ctx.Err() != nil {
			continue
		}
		var p int
		if _, err := fmt.Sscan(pid, &p); err != nil || processAlive(p) {
			continue
		}
		_ = client.removeNetwork(ctx, n.ID)
	}
}
