package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	goredis "github.com/redis/go-redis/v9"
)

//go:embed acquire_all.lua
var acquireAllLua string

var acquireAllScript = newScript(acquireAllLua)

// TryAcquireAll takes every name of reqs or none in one script,
// acquire_all.lua (dlockdriver.MultiAcquirer): one round trip for an
// uncontended AcquireAll instead of one per name. A Cluster client (the
// names' keys span slots), the compat layout (no fencing counter to
// count) and MinReplicas (one WAIT per grant) send the Locker to its
// one-by-one path.
func (d *driver) TryAcquireAll(ctx context.Context, reqs []dlockdriver.Request) ([]*dlockdriver.Grant, error) {
	if _, cluster := d.c.(*goredis.ClusterClient); cluster || d.compat || d.minReplicas > 0 {
		return nil, fmt.Errorf("redis: one script for several names: %w here", errors.ErrUnsupported)
	}
	hs := make([]*handle, len(reqs))
	keys := make([]any, 0, 5*len(reqs))
	args := make([]any, 0, len(reqs)+1)
	for i, req := range reqs {
		hs[i] = d.newHandle(req.Name, req.Token)
		keys = append(keys, hs[i].boxed...)
		args = append(args, hs[i].token)
	}
	px := millis(reqs[0].TTL)
	args = append(args, px)
	res, err := acquireAllScript.run(ctx, d.c, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: acquiring %d names: %w", len(reqs), err)
	}
	if len(res) > 0 && res[0] == 0 { // {0, i, pttl}: a fence is never 0
		if len(res) != 3 || res[1] < 1 || int(res[1]) > len(reqs) {
			return nil, fmt.Errorf("redis: acquire_all.lua answered %v", res)
		}
		switch pttl := res[2]; pttl {
		case -2: // free, waited for: the queue comes first
			return nil, dlockdriver.Busy(time.Millisecond)
		case -1: // no expiry: the holder's time is unknown
			return nil, dlockdriver.Busy(0)
		default:
			return nil, busy(-1 - max(pttl, 0))
		}
	}
	if len(res) != len(reqs) {
		return nil, fmt.Errorf("redis: acquire_all.lua answered %d fences for %d names", len(res), len(reqs))
	}
	gs := make([]*dlockdriver.Grant, len(reqs))
	for i, h := range hs {
		gs[i] = h.granted(px, uint64(res[i]), false)
	}
	return gs, nil
}
