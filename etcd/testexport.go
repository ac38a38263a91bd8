package etcd

import (
	"time"

	"github.com/dlock/dlock/internal/testexport/etcdexport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func init() {
	etcdexport.SetHooks = func(before func(pred string), ended func(clientv3.WatchResponse)) (restore func()) {
		pb, pe := beforeWatch, watchEnded
		beforeWatch, watchEnded = before, ended
		return func() { beforeWatch, watchEnded = pb, pe }
	}
	etcdexport.SemaphorePrefix = func(keyPrefix, name string) string {
		return keyPrefix + semaphoreSpace + escape(name) + "/"
	}
	etcdexport.MaxFollowed = maxFollowed
	etcdexport.SetIdleWatch = func(d time.Duration) (restore func()) {
		prev := idleWatch.Swap(int64(d))
		return func() { idleWatch.Store(prev) }
	}
}
