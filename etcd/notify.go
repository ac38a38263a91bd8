package etcd

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watch tells when the lock name may have become free
// (dlockdriver.Notifier): the channel receives when a key under the name is
// deleted, and is closed when the watch ends otherwise (a compaction, a lost
// leader, a closed stream). Waits do not use it (Acquire queues on the
// server); Locker.Observe does, to hear a leader's end when it happens.
func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	k := d.keys(name, "")
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wc := d.c.Watch(wctx, k.prefix, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	// Return once the watch is in place, so that no later deletion is
	// missed.
	select {
	case wr, ok := <-wc:
		if !ok || !wr.Created || wr.Err() != nil {
			cancel()
			err := wr.Err()
			if err == nil {
				err = errors.New("the watch ended")
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, nil, fmt.Errorf("etcd: watching %q: %w", k.prefix, err)
		}
	case <-ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("etcd: watching %q: %w", k.prefix, ctx.Err())
	}
	c := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c)
		for wr := range wc {
			if wr.Canceled || wr.Err() != nil {
				return
			}
			if len(wr.Events) > 0 {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		}
	}()
	stop := func() {
		cancel()
		<-done
	}
	return c, stop, nil
}
