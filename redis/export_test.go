package redis

import (
	"net/url"

	goredis "github.com/redis/go-redis/v9"
)

// ParseRawURL is ParseURL of a string, for the tests: the go-redis options and driver
// options a URL yields, without any I/O.
func ParseRawURL(raw string) (*goredis.Options, *Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return ParseURL(u)
}

// RefreshSHA and RefreshBatchSHA are the scripts' hashes, for tests that
// count their calls.
var (
	RefreshSHA      = refreshScript.Hash()
	RefreshBatchSHA = refreshBatchScript.Hash()
)

// AcquireScript and ReleaseScript are the lock's scripts, for the benchmark
// that calls them without the Locker (BenchmarkPeers' "scripts").
var (
	AcquireScript = acquireScript
	ReleaseScript = releaseScript
)
