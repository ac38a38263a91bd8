package redis

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
)

//go:embed refresh_batch.lua
var refreshBatchLua string

var refreshBatchScript = goredis.NewScript(refreshBatchLua)

// RefreshBatch refreshes many leases' locks (dlockdriver.BatchRefresher):
// on one server, in one script call (refresh_batch.lua); on Redis Cluster,
// whose scripts take keys of one slot only, in one pipeline of refresh.lua
// calls. Permits and read/write holds, rarer, are refreshed one by one.
func (d *driver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	granted := make([]time.Duration, len(hs))
	errs := make([]error, len(hs))
	var locks []int // indexes of lock handles
	for i, h := range hs {
		if _, ok := h.(*handle); ok {
			locks = append(locks, i)
			continue
		}
		granted[i], errs[i] = h.Refresh(ctx, ttls[i])
	}
	if len(locks) == 0 {
		return granted, errs
	}
	var results []int64
	var err error
	if _, cluster := d.c.(*goredis.ClusterClient); cluster {
		results, err = d.refreshPipelined(ctx, hs, ttls, locks)
	} else {
		results, err = d.refreshScripted(ctx, hs, ttls, locks)
	}
	if err == nil {
		// The batch counts once MinReplicas replicas have it (replicas.go).
		err = d.syncReplicas(ctx)
	}
	for j, i := range locks {
		h := hs[i].(*handle)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("redis: refreshing %q with %d others: %w", h.keys[0], len(locks)-1, err)
		case results[j] == 0:
			h.stopListening()
			errs[i] = fmt.Errorf("%w: redis: %q does not hold this lease's token", dlock.ErrNotHeld, h.keys[0])
		case results[j] < 0:
			h.stopListening()
			errs[i] = fmt.Errorf("%w: redis: %q holds another lease's token", dlock.ErrTakenOver, h.keys[0])
		default:
			granted[i] = time.Duration(millis(ttls[i])) * time.Millisecond
		}
	}
	return granted, errs
}

// batchArgs are the keys and arguments of one refresh_batch.lua call.
type batchArgs struct {
	keys []string
	args []any
}

var batchArgsPool = sync.Pool{New: func() any { return new(batchArgs) }}

func (d *driver) refreshScripted(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration, locks []int) ([]int64, error) {
	b := batchArgsPool.Get().(*batchArgs)
	defer func() {
		clear(b.keys)
		clear(b.args)
		b.keys, b.args = b.keys[:0], b.args[:0]
		batchArgsPool.Put(b)
	}()
	for _, i := range locks {
		h := hs[i].(*handle)
		b.keys = append(b.keys, h.refreshKeys...)
		b.args = append(b.args, h.token, millis(ttls[i]), len(h.refreshKeys))
	}
	vs, err := refreshBatchScript.Run(ctx, d.c, b.keys, b.args...).Int64Slice()
	if err == nil && len(vs) != len(locks) {
		err = fmt.Errorf("refresh_batch.lua answered %d results for %d locks", len(vs), len(locks))
	}
	return vs, err
}

func (d *driver) refreshPipelined(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration, locks []int) ([]int64, error) {
	cmds := make([]*goredis.Cmd, len(locks))
	_, err := d.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for j, i := range locks {
			h := hs[i].(*handle)
			cmds[j] = refreshScript.EvalSha(ctx, p, h.refreshKeys, h.token, millis(ttls[i]))
		}
		return nil
	})
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		// The script is not loaded on some node yet: EVAL once.
		_, err = d.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for j, i := range locks {
				h := hs[i].(*handle)
				cmds[j] = refreshScript.Eval(ctx, p, h.refreshKeys, h.token, millis(ttls[i]))
			}
			return nil
		})
	}
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(locks))
	for j, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			return nil, err
		}
		out[j] = n
	}
	return out, nil
}
