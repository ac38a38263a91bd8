package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	goredis "github.com/redis/go-redis/v9"
)

// Records (dlockdriver.Recorder, for dlock.Once; default layout only): the
// record of the lock P{N} is the string P{N}:record, in the lock's hash
// slot, set with PX to the retention by record.lua only while P{N} holds the
// writer's token. It survives a restart as the lock does: with AOF or RDB
// persistence; with MinReplicas, a record counts as written once WAIT
// reports that many replicas have it.
var (
	//go:embed record.lua
	recordLua    string
	recordScript = newScript(recordLua)
)

// recordKey is the record's key beside the lock's (one hash slot).
func recordKey(lockKey string) string { return lockKey + ":record" }

// Record writes h's record if its lock is still h's, in one script.
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	rh, ok := h.(*handle)
	if !ok || rh.d != d {
		return fmt.Errorf("%w: redis: Record takes a lock's handle of this driver", dlock.ErrInvalid)
	}
	lock := rh.keys[0]
	n, err := recordScript.run(ctx, d.c, []any{lock, recordKey(lock)}, rh.token, value, millis(ttl)).Int64()
	if err != nil {
		return fmt.Errorf("redis: recording %q: %w", lock, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: redis: recording %q: the lock is not the lease's", dlock.ErrNotHeld, lock)
	}
	if err := d.syncReplicas(ctx); err != nil {
		return fmt.Errorf("redis: recording %q: %w", lock, err)
	}
	return nil
}

// Recorded reads name's record.
func (d *driver) Recorded(ctx context.Context, name string) (string, bool, error) {
	key := recordKey(d.keys(name)[0])
	v, err := d.c.Get(ctx, key).Result()
	if errors.Is(err, goredis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("redis: reading %q: %w", key, err)
	}
	return v, true, nil
}
