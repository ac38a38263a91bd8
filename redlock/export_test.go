package redlock

import (
	"net/url"

	goredis "github.com/redis/go-redis/v9"
)

// ParseRawURL is ParseURL of a string, for the tests: the go-redis options of every
// node and the driver options a URL yields, without any I/O.
func ParseRawURL(raw string) ([]*goredis.Options, *Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return ParseURL(u)
}

// RefreshSHA and RefreshBatchSHA tell the watchdog's script calls apart.
var (
	RefreshSHA      = refreshScript.Hash()
	RefreshBatchSHA = refreshBatchScript.Hash()
)
