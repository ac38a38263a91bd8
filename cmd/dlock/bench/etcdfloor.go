package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdFloors returns an opener of raw etcd floors for the server of an
// etcd:// or etcds:// URL, with the client configuration the etcd driver
// derives from the same URL (etcd.ParseURL: endpoints, credentials, TLS,
// timeouts). Keys are the URL's key prefix (default "dlock/") followed by the
// lock name. Each Floor is its own client with one etcd lease per TTL,
// granted on first use and kept alive by the client's KeepAlive stream, as
// a concurrency.Session is.
//
// TryLock is one transaction: if the key's create revision is 0, put the
// token bound to that lease. Unlock is one transaction: if the key's value is
// the token, delete it.
func EtcdFloors(u *url.URL) (FloorOpener, error) {
	if u == nil || (u.Scheme != "etcd" && u.Scheme != "etcds") {
		return nil, errors.New("bench: the etcd floor needs an etcd:// or etcds:// URL")
	}
	cfg, opts, err := etcd.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Floor, error) {
		c, err := clientv3.New(*cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: etcd floor: %w", err)
		}
		if _, err := c.Get(ctx, opts.KeyPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)); err != nil {
			return nil, errors.Join(fmt.Errorf("bench: etcd floor: %w", err), c.Close())
		}
		f := &etcdFloor{c: c, prefix: opts.KeyPrefix, leases: map[int64]clientv3.LeaseID{}}
		f.ctx, f.cancel = context.WithCancel(context.Background())
		return f, nil
	}, nil
}

type etcdFloor struct {
	c      *clientv3.Client
	prefix string
	leases map[int64]clientv3.LeaseID // by TTL in seconds

	ctx    context.Context // ends the keepalives
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines draining the keepalive responses
}

// lease returns the floor's etcd lease for ttl, granting it and starting its
// keepalive on first use.
func (f *etcdFloor) lease(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	sec := max(1, int64((ttl+time.Second-1)/time.Second))
	if id, ok := f.leases[sec]; ok {
		return id, nil
	}
	resp, err := f.c.Grant(ctx, sec)
	if err != nil {
		return 0, err
	}
	ch, err := f.c.KeepAlive(f.ctx, resp.ID)
	if err != nil {
		return 0, err
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for range ch { // until f.ctx ends (or the lease is gone)
		}
	}()
	f.leases[sec] = resp.ID
	return resp.ID, nil
}

func (f *etcdFloor) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	id, err := f.lease(ctx, ttl)
	if err != nil {
		return false, err
	}
	key := f.prefix + name
	resp, err := f.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, token, clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func (f *etcdFloor) Unlock(ctx context.Context, name, token string) error {
	key := f.prefix + name
	_, err := f.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", token)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// Close revokes the floor's leases (which deletes any key it still holds)
// and closes its client.
func (f *etcdFloor) Close() error {
	f.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, id := range f.leases {
		if _, err := f.c.Revoke(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, f.c.Close())
	f.wg.Wait()
	return errors.Join(errs...)
}
