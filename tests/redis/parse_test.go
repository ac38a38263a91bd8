package redis_test

import (
	"net/url"

	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// parseRawURL is redis.ParseURL of a string: the go-redis options and driver
// options a URL yields, without any I/O.
func parseRawURL(raw string) (*goredis.Options, *redis.Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return redis.ParseURL(u)
}
