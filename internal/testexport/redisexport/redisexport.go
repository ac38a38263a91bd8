// Package redisexport holds package redis's unexported values for the tests
// module; package redis sets them at init (see ../doc.go).
package redisexport

import goredis "github.com/redis/go-redis/v9"

var (
	// RefreshSHA and RefreshBatchSHA are the watchdog scripts' hashes, for
	// tests that count their calls.
	RefreshSHA, RefreshBatchSHA string
	// AcquireScript and ReleaseScript are the lock's scripts, for the
	// benchmark that calls them without the Locker.
	AcquireScript, ReleaseScript *goredis.Script
)
