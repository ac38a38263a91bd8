// Package redisclient checks the go-redis clients an application hands to
// dlock's redis drivers (package redis's Locker, package
// queue/redisqueue's Client), and makes the options of those the drivers
// make from a URL.
package redisclient

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	goredis "github.com/redis/go-redis/v9"
)

// ParseURL is goredis.ParseURL of u, a redis:// or rediss:// URL whose
// query holds only go-redis's parameters, with context deadlines enabled
// (Check's condition). Its error matches dlock.ErrInvalid, is named after
// driver and leaves out the password of orig, the URL the user gave.
func ParseURL(u, orig *url.URL, driver string) (*goredis.Options, error) {
	o, err := goredis.ParseURL(u.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL
		}
		msg := strings.TrimPrefix(dlockdriver.RedactText(err.Error(), orig), "redis: ")
		return nil, fmt.Errorf("%w: %s: %s", dlock.ErrInvalid, driver, msg)
	}
	o.ContextTimeoutEnabled = true
	return o, nil
}

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
