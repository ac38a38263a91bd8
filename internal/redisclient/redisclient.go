// Package redisclient checks the go-redis clients an application hands to
// dlock's redis drivers (package redis's Locker, package
// queue/redisqueue's Client).
package redisclient

import (
	"fmt"

	"github.com/dlock/dlock"
	goredis "github.com/redis/go-redis/v9"
)

// Check refuses the clients the drivers cannot use correctly: nil, a
// *goredis.Ring (it shards keys on the client's side), and a client that
// ignores context deadlines. Other implementations of UniversalClient are
// taken on trust.
func Check(client goredis.UniversalClient) error {
	var ctxTimeouts bool
	switch c := client.(type) {
	case nil:
		return fmt.Errorf("%w: redis: nil client", dlock.ErrInvalid)
	case *goredis.Ring:
		return fmt.Errorf("%w: redis: a *redis.Ring is not supported: it shards keys on the client's side and moves them when a shard misses a health check, so two holders could take one lock; use a Redis Cluster (*redis.ClusterClient) or one server", dlock.ErrInvalid)
	case *goredis.Client:
		if c == nil {
			return fmt.Errorf("%w: redis: nil client", dlock.ErrInvalid)
		}
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	case *goredis.ClusterClient:
		if c == nil {
			return fmt.Errorf("%w: redis: nil client", dlock.ErrInvalid)
		}
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !ctxTimeouts {
		return fmt.Errorf("%w: redis: the client ignores context deadlines: set ContextTimeoutEnabled: true in its Options (the Locker bounds every call with a context)", dlock.ErrInvalid)
	}
	return nil
}
