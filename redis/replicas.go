package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
)

// DefaultMinReplicasTimeout is how long a grant or refresh waits for
// Options.MinReplicas replicas by default.
const DefaultMinReplicasTimeout = 100 * time.Millisecond

// ErrReplicas is wrapped by the error of a grant or refresh that fewer than
// Options.MinReplicas replicas acknowledged in time. A grant is given back
// first: the lock is not held.
var ErrReplicas = errors.New("redis: too few replicas acknowledged the lock's write")

// Replication (Options.MinReplicas). Redis replicates asynchronously: a
// primary can acknowledge a lock and fail before any replica has it, and
// the replica promoted in its place grants the lock again. With MinReplicas
// N a grant, and every refresh, counts only once WAIT has reported that N
// replicas have every write made before it: after the grant (or refresh)
// the Locker writes a key of its own and sends WAIT N on that connection,
// in one pipeline. Replication is in order, so the replicas that have that
// write have the grant, whichever client's script made it (a FIFO handoff
// is written by the releasing holder's script).
//
// What it promises: a lease that the Locker reports held was on N replicas
// at its grant and at its last refresh. What it does not: WAIT is not
// consensus. Sentinel may still promote a replica that lacks a later
// refresh, or one of the others (with N smaller than the number of
// replicas); a write can reach replicas and still be lost by the primary
// (a failed WAIT does not undo it; the Locker gives the grant back). It
// narrows the window of the documented failover hazard; fencing closes it.

// syncReplicas writes this Locker's sync key and waits until MinReplicas
// replicas have it, on one connection; nil when MinReplicas is 0.
func (d *driver) syncReplicas(ctx context.Context) error {
	if d.minReplicas == 0 {
		return nil
	}
	var wait *goredis.Cmd
	_, err := d.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.Set(ctx, d.syncKey, "", time.Minute)
		wait = p.Do(ctx, "wait", d.minReplicas, d.replicasTimeout.Milliseconds())
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis: waiting for %d replicas: %w", d.minReplicas, err)
	}
	if n, _ := wait.Int64(); n < int64(d.minReplicas) {
		return fmt.Errorf("%w: %d of %d within %v", ErrReplicas, n, d.minReplicas, d.replicasTimeout)
	}
	return nil
}

// replicated returns a grant once MinReplicas replicas have it; when they
// do not, it gives the grant back and returns the error.
func (d *driver) replicated(ctx context.Context, name string, g *dlockdriver.Grant, err error) (*dlockdriver.Grant, error) {
	if err != nil || d.minReplicas == 0 {
		return g, err
	}
	if serr := d.syncReplicas(ctx); serr != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if rerr := g.Handle.Release(rctx); rerr != nil && !errors.Is(rerr, dlock.ErrNotHeld) {
			serr = errors.Join(serr, fmt.Errorf("giving the grant back: %w", rerr))
		}
		return nil, fmt.Errorf("redis: %q was granted, not replicated: %w", name, serr)
	}
	return g, nil
}

// validateReplicas checks Options.MinReplicas and its timeout.
func validateReplicas(o *Options, client goredis.UniversalClient) error {
	switch {
	case o.MinReplicas < 0:
		return invalid("MinReplicas %d is negative", o.MinReplicas)
	case o.MinReplicasTimeout < 0:
		return invalid("MinReplicasTimeout %v is negative", o.MinReplicasTimeout)
	case o.MinReplicas == 0:
		return nil
	}
	if _, ok := client.(*goredis.ClusterClient); ok {
		return invalid("MinReplicas needs one primary (a Client or a Sentinel failover client): a Cluster's WAIT answers for one shard")
	}
	return nil
}
