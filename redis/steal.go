package redis

import (
	"context"
	_ "embed"
	"fmt"

	dlockdriver "github.com/dlock/dlock/driver"
)

//go:embed steal.lua
var stealLua string

var stealScript = newScript(stealLua)

// Steal makes req.Token the holder of req.Name at once, with the next
// fencing token (dlockdriver.Stealer): one script, steal.lua. The queue of
// waiters is left as it is. In the default layout the script publishes the
// previous holder's token on the prefix's steal channel, where its Locker
// listens once it has held a lease (handle.OnLost): the loss is reported
// at once, as ErrTakenOver. In the compat layout, and if that message is
// missed, its next refresh finds it.
func (d *driver) Steal(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	h := d.newHandle(req.Name, req.Token)
	px := millis(req.TTL)
	args := []any{h.token, px}
	if !d.compat {
		args = append(args, d.taken)
		if req.Metadata != "" {
			args = append(args, req.Metadata)
		}
	}
	f, err := stealScript.run(ctx, d.c, h.boxed, args...).Int64()
	if err != nil {
		return nil, fmt.Errorf("redis: taking %q over: %w", h.keys[0], err)
	}
	var fence uint64
	if !d.compat {
		fence = uint64(f)
	}
	return d.replicated(ctx, req.Name, h.granted(px, fence, req.Metadata != "" && !d.compat), nil)
}
