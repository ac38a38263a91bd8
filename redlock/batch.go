package redlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
)

//go:embed refresh_batch.lua
var refreshBatchLua string

var refreshBatchScript = goredis.NewScript(refreshBatchLua)

// RefreshBatch refreshes many leases (dlockdriver.BatchRefresher): one
// refresh_batch.lua call per node for the whole batch, sent to every node at
// once; each lease is then judged as Refresh judges it alone: extended on a
// majority, or not held on more nodes than a majority allows (its remains
// cleaned up), or no quorum. It returns when every lease is decided or every
// node has answered (each bounded by the node timeout of the shortest TTL).
func (d *driver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	granted := make([]time.Duration, len(hs))
	errs := make([]error, len(hs))
	n, q := len(d.nodes), d.quorum
	keys := make([]string, len(hs))
	args := make([]any, 0, 2*len(hs))
	shortest := ttls[0]
	for i, dh := range hs {
		h := dh.(*handle)
		h.mu.Lock()
		h.ttl = ttls[i]
		h.mu.Unlock()
		keys[i] = h.keys[0]
		args = append(args, h.token, millis(ttls[i]))
		shortest = min(shortest, ttls[i])
	}
	results := fanout(d, ctx, d.timeout(shortest), func(ctx context.Context, _ int, nd *node) ([]int64, error) {
		vs, err := refreshBatchScript.Run(ctx, nd.c, keys, args...).Int64Slice()
		if err == nil && len(vs) != len(keys) {
			err = fmt.Errorf("refresh_batch.lua answered %d results for %d locks", len(vs), len(keys))
		}
		return vs, err
	})
	extended := make([]int, len(hs))
	notHeld := make([]int, len(hs))
	decided := make([]bool, len(hs))
	undecided := len(hs)
	var nodeErrs []error
	for range n {
		var r nodeResult[[]int64]
		select {
		case r = <-results:
		case <-ctx.Done():
			for i, dh := range hs {
				if !decided[i] {
					errs[i] = fmt.Errorf("redlock: refreshing %q: %w", dh.(*handle).keys[0], ctx.Err())
				}
			}
			return granted, errs
		}
		if r.err != nil {
			nodeErrs = append(nodeErrs, r.err)
			continue
		}
		for i, v := range r.v {
			if decided[i] {
				continue
			}
			if v == 1 {
				extended[i]++
			} else {
				notHeld[i]++
			}
			h := hs[i].(*handle)
			switch {
			case extended[i] >= q:
				granted[i] = time.Duration(millis(ttls[i])) * time.Millisecond
			case notHeld[i] > n-q:
				h.cleanUp(ctx)
				errs[i] = fmt.Errorf("%w: redlock: %d of %d nodes no longer hold %q for this lease", dlock.ErrNotHeld, notHeld[i], n, h.keys[0])
			default:
				continue
			}
			decided[i] = true
			undecided--
		}
		if undecided == 0 {
			return granted, errs
		}
	}
	for i, dh := range hs {
		if !decided[i] {
			h := dh.(*handle)
			errs[i] = fmt.Errorf("%w: refreshing %q with %d others: %d of %d nodes extended it, %d do not hold it, %d failed: %w",
				ErrNoQuorum, h.keys[0], len(hs)-1, extended[i], n, notHeld[i], len(nodeErrs), errors.Join(nodeErrs...))
		}
	}
	return granted, errs
}
