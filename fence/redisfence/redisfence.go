// Package redisfence is a fence guard for data in Redis: [Set] writes a key
// together with the writer's fencing token, in one script that refuses the
// write when the key was written with a higher token.
//
//	token, _ := fence.Token(lease)
//	err := redisfence.Set(ctx, rdb, "report:today", body, token)
//	if errors.Is(err, fence.ErrStale) {
//		// a newer holder of the lock has written report:today
//	}
//
// A fenced key is a hash with the fields "value" and "fence"; read it with
// [Get] (or HGET key value). Write it only through Set: a plain SET or an
// expiry drops the stored fence, after which any token is accepted. The key
// may live on another Redis than the lock, and in a Cluster (one key per
// call).
package redisfence

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/fence"
)

//go:embed set.lua
var setLua string

var setScript = goredis.NewScript(setLua)

// Set stores value at key with token, unless the key holds a value written
// with a higher token: then it returns a *fence.StaleError matching
// fence.ErrStale and leaves the key as it is. An equal token is accepted.
// ctx bounds the call.
func Set(ctx context.Context, c goredis.Scripter, key, value string, token uint64) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", fence.ErrInvalid)
	}
	res, err := setScript.Run(ctx, c, []string{key}, strconv.FormatUint(token, 10), value).Slice()
	if err != nil {
		return fmt.Errorf("redisfence: setting %q with fence %d: %w", key, token, err)
	}
	if len(res) != 2 {
		return fmt.Errorf("redisfence: setting %q: unexpected reply %v", key, res)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return nil
	}
	s, _ := res[1].(string)
	h, _ := strconv.ParseUint(s, 10, 64)
	return &fence.StaleError{Resource: key, Token: token, Highest: h}
}

// Get returns the value of a fenced key and the token it was written with.
// A missing key is an error matching goredis.Nil.
func Get(ctx context.Context, c goredis.Cmdable, key string) (value string, token uint64, err error) {
	res, err := c.HMGet(ctx, key, "value", "fence").Result()
	if err != nil {
		return "", 0, fmt.Errorf("redisfence: reading %q: %w", key, err)
	}
	v, ok1 := res[0].(string)
	f, ok2 := res[1].(string)
	if !ok1 || !ok2 {
		return "", 0, fmt.Errorf("redisfence: reading %q: %w", key, goredis.Nil)
	}
	token, err = strconv.ParseUint(f, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("redisfence: %q holds fence %q: %w", key, f, err)
	}
	return v, token, nil
}
