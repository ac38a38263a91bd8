package etcd

import (
	"context"
	"fmt"
	"strings"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Inspect describes name (dlockdriver.Inspector): the holder is the key
// with the lowest create revision under the name (dlock's, or that of a
// concurrency.Mutex or `etcdctl lock` on MutexName, whose key ends in its
// lease ID instead of a token); its metadata is the key's value, its fence
// the create revision, its TTL its etcd lease's remaining time (whole
// seconds); every other key is a waiter. etcd does not record when a key
// was written in time, only in revisions: Since is zero.
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1}
	k := d.keys(name, "")
	resp, err := d.c.Get(ctx, k.prefix, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return info, fmt.Errorf("etcd: inspecting %q: %w", k.prefix, err)
	}
	if resp.Count == 0 {
		return info, nil
	}
	kv := resp.Kvs[0]
	info.Held, info.Waiters = true, int(resp.Count-1)
	info.Token = dlockdriver.TokenPrefix(strings.TrimPrefix(string(kv.Key), k.prefix))
	info.Metadata = string(kv.Value)
	info.Fence, info.HasFence = uint64(kv.CreateRevision), true
	if kv.Lease != 0 {
		info.Holder = fmt.Sprintf("lease %x", kv.Lease)
		ttl, err := d.c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err == nil && ttl.TTL >= 0 {
			info.TTL = time.Duration(ttl.TTL) * time.Second
		}
	}
	return info, nil
}

// Names lists the lock names held or waited on that begin with prefix
// (dlockdriver.Lister): the first path component under the key prefix of
// each key there, but for the namespaces of semaphores and read/write
// locks.
func (d *driver) Names(ctx context.Context, prefix string) ([]string, error) {
	from := d.prefix + escape(prefix)
	resp, err := d.c.Get(ctx, from, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd: listing locks under %q: %w", from, err)
	}
	var names []string
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), d.prefix)
		esc, _, ok := strings.Cut(rest, "/")
		if !ok || esc+"/" == semaphoreSpace || esc+"/" == rwlockSpace || esc+"/" == markerSpace || esc+"/" == recordSpace {
			continue // not a lock's key
		}
		names = append(names, unescape(esc))
	}
	return names, nil
}

// unescape undoes escape.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%2F", "/", "%25", "%").Replace(s)
}
