// Package etcdexport holds package etcd's test hooks and unexported values for
// the tests module; package etcd sets them at init (see ../doc.go).
package etcdexport

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	// SetHooks installs test hooks (nil: none) and returns a function
	// restoring the previous ones. Tests using it must not run in parallel.
	SetHooks func(before func(pred string), ended func(clientv3.WatchResponse)) (restore func())
	// SemaphorePrefix is the prefix of the keys of the semaphore name.
	SemaphorePrefix func(keyPrefix, name string) string
	// MaxFollowed is how many keys ahead of it a waiter follows on the
	// Locker's watch.
	MaxFollowed int
	// SetIdleWatch sets how long a Locker's watch runs on after its last
	// lock or waiter, and returns a function restoring the previous value.
	// Tests using it must not run in parallel.
	SetIdleWatch func(d time.Duration) (restore func())
)
