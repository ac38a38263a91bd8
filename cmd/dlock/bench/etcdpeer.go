package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// EtcdPeers returns the peer on the server of an etcd:// or etcds:// URL:
// etcd's own concurrency.Mutex, each client made from the configuration the
// etcd floor uses (EtcdFloors), with one concurrency.Session (one etcd lease
// kept alive) per client, created at its first lock with that lock's TTL
// rounded up to seconds. Lock prefixes are the URL's key prefix followed by
// the lock name.
func EtcdPeers(u *url.URL) ([]Peer, error) {
	if u == nil || (u.Scheme != "etcd" && u.Scheme != "etcds") {
		return nil, errors.New("bench: the etcd peer needs an etcd:// or etcds:// URL")
	}
	cfg, opts, err := etcd.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return []Peer{{
		Name: "concurrency.Mutex", Module: "go.etcd.io/etcd/client/v3",
		About: "one concurrency.Session per client; TryLock is Mutex.TryLock, Lock is Mutex.Lock (waits on the previous key's deletion)",
		Open: func(ctx context.Context) (Floor, error) {
			c, err := clientv3.New(*cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: etcd peer: %w", err)
			}
			if _, err := c.Get(ctx, opts.KeyPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)); err != nil {
				return nil, errors.Join(fmt.Errorf("bench: etcd peer: %w", err), c.Close())
			}
			return &etcdPeer{c: c, prefix: opts.KeyPrefix, held: map[string]*concurrency.Mutex{}}, nil
		},
	}}, nil
}

type etcdPeer struct {
	c      *clientv3.Client
	prefix string
	s      *concurrency.Session
	held   map[string]*concurrency.Mutex // by token
}

func (p *etcdPeer) mutex(name string, ttl time.Duration) (*concurrency.Mutex, error) {
	if p.s == nil {
		sec := max(1, int((ttl+time.Second-1)/time.Second))
		s, err := concurrency.NewSession(p.c, concurrency.WithTTL(sec))
		if err != nil {
			return nil, err
		}
		p.s = s
	}
	return concurrency.NewMutex(p.s, p.prefix+name), nil
}

func (p *etcdPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	m, err := p.mutex(name, ttl)
	if err != nil {
		return false, err
	}
	switch err := m.TryLock(ctx); {
	case errors.Is(err, concurrency.ErrLocked):
		return false, nil
	case err != nil:
		return false, err
	}
	p.held[token] = m
	return true, nil
}

func (p *etcdPeer) Lock(ctx context.Context, name, token string, ttl time.Duration) error {
	m, err := p.mutex(name, ttl)
	if err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	p.held[token] = m
	return nil
}

func (p *etcdPeer) Unlock(ctx context.Context, _, token string) error {
	m, ok := p.held[token]
	if !ok {
		return nil
	}
	delete(p.held, token)
	return m.Unlock(ctx)
}

// Close ends the session (revoking its lease, which deletes any key it
// still holds) and closes the client.
func (p *etcdPeer) Close() error {
	var errs []error
	if p.s != nil {
		errs = append(errs, p.s.Close())
	}
	return errors.Join(append(errs, p.c.Close())...)
}
