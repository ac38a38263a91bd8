package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// zkTryWait is how long the zk.Lock peer's TryLock waits for a lock:
// go-zookeeper has no try-lock, and the bench tries only names that are free,
// which zk.Lock takes without waiting.
const zkTryWait = time.Second

// ZooKeeperPeers returns the peer on the ensemble of a zk:// URL:
// go-zookeeper's own zk.Lock (the textbook recipe with a watch on the
// previous node), each client one connection and session made as the
// zookeeper floor makes them (ZooKeeperFloors: the URL's hosts, root and
// credentials, the first lock's TTL as the session timeout).
//
// zk.Lock has neither a try-lock nor a context. Lock runs zk.Lock.Lock in a
// goroutine and returns when ctx ends, leaving it to give the lock back when
// granted; TryLock is the same bounded by zkTryWait, and reports false after
// it. Each lock name's node is created as a container (as by the floor) so
// that the server removes it once unused; zk.Lock would make it persistent.
func ZooKeeperPeers(u *url.URL) ([]Peer, error) {
	opener, err := ZooKeeperFloors(u)
	if err != nil {
		return nil, err
	}
	return []Peer{{
		Name: "zk.Lock", Module: "github.com/go-zookeeper/zk",
		About: fmt.Sprintf("zk.NewLock per acquisition on one connection per client; Lock is Lock.Lock (a watch on the previous node), TryLock is Lock.Lock given %v (the library has no try-lock)", zkTryWait),
		Open: func(ctx context.Context) (Floor, error) {
			f, err := opener(ctx)
			if err != nil {
				return nil, err
			}
			return &zkPeer{f: f.(*zkFloor), held: map[string]*zk.Lock{}, made: map[string]bool{}}, nil
		},
	}}, nil
}

type zkPeer struct {
	f    *zkFloor // the connection, root, credentials and ACL
	held map[string]*zk.Lock
	made map[string]bool // lock names whose node was created
	bg   detached
}

func (p *zkPeer) lock(ctx context.Context, name, token string, ttl time.Duration) error {
	if err := p.f.connect(ttl); err != nil {
		return err
	}
	parent := p.f.root + "/" + strings.ReplaceAll(name, "/", "%2F")
	if !p.made[parent] {
		if err := p.f.makeParent(parent); err != nil {
			return err
		}
		p.made[parent] = true
	}
	l := zk.NewLock(p.f.conn, parent, p.f.acl)
	err := p.bg.wait(ctx, l.Lock, func() { _ = l.Unlock() })
	if err != nil {
		return err
	}
	p.held[token] = l
	return nil
}

func (p *zkPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, zkTryWait)
	defer cancel()
	err := p.lock(tctx, name, token, ttl)
	if err != nil && tctx.Err() != nil && ctx.Err() == nil {
		return false, nil
	}
	return err == nil, err
}

func (p *zkPeer) Lock(ctx context.Context, name, token string, ttl time.Duration) error {
	return p.lock(ctx, name, token, ttl)
}

func (p *zkPeer) Unlock(_ context.Context, _, token string) error {
	l, ok := p.held[token]
	if !ok {
		return nil
	}
	delete(p.held, token)
	return l.Unlock()
}

// Close closes the connection, which ends the session (deleting its lock
// nodes) and any wait left behind, and waits for those.
func (p *zkPeer) Close() error {
	err := p.f.Close()
	p.bg.close()
	return err
}
