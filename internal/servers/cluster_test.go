package servers

import (
	"context"
	"testing"
	"time"
)

// Servers started on a Network are attached to it under their alias, and
// still answer on their port published on 127.0.0.1.
func TestNetwork(t *testing.T) {
	n := RequireNetwork(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, alias := range []string{"one", "two"} {
		s := RequireNewWith(t, Redis, &StartOptions{Network: n.Name(), Alias: alias})
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("%s: %v", alias, err)
		}
		client, err := dockerClient(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.inspectContainer(ctx, s.containerID)
		if err != nil {
			t.Fatal(err)
		}
		ep, ok := c.NetworkSettings.Networks[n.Name()]
		if !ok {
			t.Fatalf("%s: not on %s (networks %v)", alias, n.Name(), c.NetworkSettings.Networks)
		}
		found := false
		for _, a := range ep.Aliases {
			found = found || a == alias
		}
		if !found {
			t.Errorf("%s: aliases %v", alias, ep.Aliases)
		}
	}
}
