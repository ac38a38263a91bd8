package etcd

import (
	"net/url"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ParseURL exposes parseURL to the tests: the client configuration and
// driver options a URL yields, without any I/O.
func ParseURL(raw string) (*clientv3.Config, *Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return parseURL(u)
}

// SetHooks installs test hooks (nil: none) and returns a function restoring
// the previous ones. Tests using it must not run in parallel.
func SetHooks(before func(pred string), ended func(clientv3.WatchResponse)) (restore func()) {
	pb, pe := beforeWatch, watchEnded
	beforeWatch, watchEnded = before, ended
	return func() { beforeWatch, watchEnded = pb, pe }
}
