package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

// RedisPeers returns the peers on the server of a redis:// or rediss://
// URL, each client made with the options the redis floor uses
// (RedisFloors): go-redsync/redsync with one pool, and bsm/redislock.
func RedisPeers(u *url.URL) ([]Peer, error) {
	opts, err := redisOptions(u, "peer")
	if err != nil {
		return nil, err
	}
	return []Peer{
		{
			Name: "redsync", Module: "github.com/go-redsync/redsync/v4",
			About: fmt.Sprintf("redsync.New with one go-redis pool; TryLock is Mutex.TryLockContext, Lock is Mutex.LockContext retrying every %v with no limit on tries (redsync's default: 32 tries, 50–250ms apart)", PeerRetryDelay),
			Open: func(ctx context.Context) (Floor, error) {
				return openRedsync(ctx, []*goredis.Options{opts})
			},
		},
		{
			Name: "redislock", Module: "github.com/bsm/redislock",
			About: fmt.Sprintf("redislock.Client.Obtain; TryLock with no retry (its default), Lock with RetryStrategy LinearBackoff(%v)", PeerRetryDelay),
			Open: func(ctx context.Context) (Floor, error) {
				c, err := dialRedis(ctx, opts, "peer redislock")
				if err != nil {
					return nil, err
				}
				return &redislockPeer{c: c, rl: redislock.New(c), held: map[string]*redislock.Lock{}}, nil
			},
		},
	}, nil
}

// RedlockPeers returns the peer on the nodes of a redlock:// or redlocks://
// URL: go-redsync/redsync with one pool per node, each client made with the
// options the redlock floor uses (RedlockFloors).
func RedlockPeers(u *url.URL) ([]Peer, error) {
	nodes, err := redlockOptions(u, "peer")
	if err != nil {
		return nil, err
	}
	return []Peer{{
		Name: "redsync", Module: "github.com/go-redsync/redsync/v4",
		About: fmt.Sprintf("redsync.New with one go-redis pool per node (%d); TryLock is Mutex.TryLockContext, Lock is Mutex.LockContext retrying every %v with no limit on tries (redsync's default: 32 tries, 50–250ms apart)", len(nodes), PeerRetryDelay),
		Open: func(ctx context.Context) (Floor, error) {
			return openRedsync(ctx, nodes)
		},
	}}, nil
}

// redsyncPeer is one redsync client: a pool per node.
type redsyncPeer struct {
	clients []*goredis.Client
	rs      *redsync.Redsync
	held    map[string]*redsync.Mutex // by token
}

func openRedsync(ctx context.Context, nodes []*goredis.Options) (*redsyncPeer, error) {
	p := &redsyncPeer{held: map[string]*redsync.Mutex{}}
	pools := make([]redsyncredis.Pool, 0, len(nodes))
	for _, o := range nodes {
		c, err := dialRedis(ctx, o, "peer redsync")
		if err != nil {
			return nil, errors.Join(err, p.Close())
		}
		p.clients = append(p.clients, c)
		pools = append(pools, redsyncgoredis.NewPool(c))
	}
	p.rs = redsync.New(pools...)
	return p, nil
}

func (p *redsyncPeer) mutex(name string, ttl time.Duration) *redsync.Mutex {
	return p.rs.NewMutex(name, redsync.WithExpiry(ttl),
		redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(PeerRetryDelay))
}

func (p *redsyncPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	m := p.mutex(name, ttl)
	if err := m.TryLockContext(ctx); err != nil {
		// A node that answered with an error, rather than with the key
		// being taken, is a failure.
		if _, ok := errors.AsType[*redsync.RedisError](err); ok {
			return false, err
		}
		return false, nil
	}
	p.held[token] = m
	return true, nil
}

func (p *redsyncPeer) Lock(ctx context.Context, name, token string, ttl time.Duration) error {
	m := p.mutex(name, ttl)
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	p.held[token] = m
	return nil
}

func (p *redsyncPeer) Unlock(ctx context.Context, _, token string) error {
	m, ok := p.held[token]
	if !ok {
		return nil
	}
	delete(p.held, token)
	ok, err := m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: the lock was not held on a majority of nodes")
	}
	return err
}

func (p *redsyncPeer) Close() error {
	errs := make([]error, len(p.clients))
	for i, c := range p.clients {
		errs[i] = c.Close()
	}
	return errors.Join(errs...)
}

// redislockPeer is one bsm/redislock client.
type redislockPeer struct {
	c    *goredis.Client
	rl   *redislock.Client
	held map[string]*redislock.Lock // by token
}

func (p *redislockPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	l, err := p.rl.Obtain(ctx, name, ttl, nil)
	switch {
	case errors.Is(err, redislock.ErrNotObtained):
		return false, nil
	case err != nil:
		return false, err
	}
	p.held[token] = l
	return true, nil
}

func (p *redislockPeer) Lock(ctx context.Context, name, token string, ttl time.Duration) error {
	l, err := p.rl.Obtain(ctx, name, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(PeerRetryDelay)})
	if err != nil {
		return err
	}
	p.held[token] = l
	return nil
}

func (p *redislockPeer) Unlock(ctx context.Context, _, token string) error {
	l, ok := p.held[token]
	if !ok {
		return nil
	}
	delete(p.held, token)
	return l.Release(ctx)
}

func (p *redislockPeer) Close() error { return p.c.Close() }
