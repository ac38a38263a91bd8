package redlock_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/redlock"
)

// harness gives every locker its own go-redis clients, one per node, each
// dialling its node through a faultnet proxy of its own; the Faults it
// returns act on all of that locker's proxies at once.
type harness struct {
	c      *cluster
	compat bool
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	clients, ps := h.c.proxied(t)
	o := &redlock.Options{Compat: h.compat}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := redlock.New(clients, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, ps
}

// Residue reports the lock key on every node that still has it (the fence
// counters persist by design).
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	key := redlock.DefaultKeyPrefix + "{" + name + "}"
	if h.compat {
		key = name
	}
	var left []string
	for i, r := range h.c.raws {
		n, err := r.Exists(ctx, key).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			left = append(left, fmt.Sprintf("node %d: %s", i, key))
		}
	}
	return left, nil
}

// The default layout on 5 nodes.
func TestConformance(t *testing.T) {
	conformance.Run(t, harness{c: newCluster(t, 5, nil)})
}

// The compat layout on 3 nodes.
func TestConformanceCompat(t *testing.T) {
	conformance.Run(t, harness{c: newCluster(t, 3, nil), compat: true})
}
