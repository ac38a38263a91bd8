package dlocktest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// Servers started on a Network are attached to it alone under their alias,
// reach each other by it, and still answer on their port published on
// 127.0.0.1.
func TestNetwork(t *testing.T) {
	n := RequireNetwork(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	srvs := map[string]*Server{}
	for _, alias := range []string{"one", "two"} {
		s := RequireNewWith(t, Redis, &StartOptions{Network: n.Name(), Alias: alias})
		srvs[alias] = s
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("%s: %v", alias, err)
		}
		c := inspect(t, s)
		if len(c.NetworkSettings.Networks) != 1 {
			t.Errorf("%s: on networks %v, want %s alone", alias, c.NetworkSettings.Networks, n.Name())
		}
		ep, ok := c.NetworkSettings.Networks[n.Name()]
		if !ok {
			t.Fatalf("%s: not on %s (networks %v)", alias, n.Name(), c.NetworkSettings.Networks)
		}
		if !slices.Contains(ep.Aliases, alias) {
			t.Errorf("%s: aliases %v", alias, ep.Aliases)
		}
	}
	// "two" replicates "one", which it can only find by its alias.
	if _, err := redisCommand(ctx, srvs["two"].Addr(), "REPLICAOF", "one", "6379"); err != nil {
		t.Fatal(err)
	}
	if _, err := redisCommand(ctx, srvs["one"].Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, func() error {
		v, err := redisCommand(ctx, srvs["two"].Addr(), "GET", "k")
		if v != "v" {
			return fmt.Errorf("GET k on the replica: got %v, %v; want v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("replication by alias: %v", err)
	}

	if err := n.Close(); err != nil {
		t.Errorf("Close with servers on it: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
