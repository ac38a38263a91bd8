package redlock

import (
	"net/url"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURL exposes parseURL to the tests: the go-redis options of every
// node and the driver options a URL yields, without any I/O.
func ParseURL(raw string) ([]*goredis.Options, *Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return parseURL(u)
}
