package etcd

import clientv3 "go.etcd.io/etcd/client/v3"

// SetHooks installs test hooks (nil: none) and returns a function restoring
// the previous ones. Tests using it must not run in parallel.
func SetHooks(before func(pred string), ended func(clientv3.WatchResponse)) (restore func()) {
	pb, pe := beforeWatch, watchEnded
	beforeWatch, watchEnded = before, ended
	return func() { beforeWatch, watchEnded = pb, pe }
}

// SemaphorePrefix is the prefix of the keys of the semaphore name.
func SemaphorePrefix(keyPrefix, name string) string {
	return keyPrefix + semaphoreSpace + escape(name) + "/"
}

// MaxFollowed is how many keys ahead of it a waiter follows on the Locker's
// watch.
const MaxFollowed = maxFollowed
