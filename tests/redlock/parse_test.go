package redlock_test

import (
	"net/url"

	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// parseRawURL is redlock.ParseURL of a string: the go-redis options of every
// node and the driver options a URL yields, without any I/O.
func parseRawURL(raw string) ([]*goredis.Options, *redlock.Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return redlock.ParseURL(u)
}
