package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperFloors returns an opener of raw ZooKeeper floors for the ensemble
// of a zk:// URL: its hosts, its path as the root of the lock nodes (default
// /dlock, as for the zookeeper driver) and its user and password as digest
// credentials. Query parameters are ignored (the floor's nodes get the
// world-open ACL, or the creator-only one with credentials). Each Floor is
// its own connection and session, dialled at its first TryLock with that
// lock's TTL as the session timeout.
//
// TryLock is the textbook recipe without waiting: create an
// ephemeral-sequential node under the name's node (creating that as a
// container when missing), list the children, and hold the lock if the node
// is the lowest, else delete it. Unlock deletes the node. That is three
// round trips a cycle, as go-zookeeper's zk.Lock makes uncontended; the
// floor takes no fencing token and sets no watch.
func ZooKeeperFloors(u *url.URL) (FloorOpener, error) {
	if u == nil || u.Scheme != "zk" || u.Host == "" {
		return nil, errors.New("bench: the zookeeper floor needs a zk://host:port[,host:port…][/root] URL")
	}
	f := zkFloor{servers: strings.Split(u.Host, ","), root: strings.TrimSuffix(u.Path, "/"), acl: zk.WorldACL(zk.PermAll)}
	if f.root == "" {
		f.root = "/dlock"
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		f.auth = []byte(u.User.Username() + ":" + pw)
		f.acl = zk.AuthACL(zk.PermAll)
	}
	return func(context.Context) (Floor, error) {
		cp := f
		cp.held = map[string]string{}
		return &cp, nil
	}, nil
}

type zkFloor struct {
	servers []string
	root    string
	auth    []byte
	acl     []zk.ACL

	conn *zk.Conn
	held map[string]string // token -> lock node
}

var quietZK = log.New(io.Discard, "", 0)

func (f *zkFloor) connect(ttl time.Duration) error {
	if f.conn != nil {
		return nil
	}
	c, _, err := zk.Connect(f.servers, ttl, zk.WithLogger(quietZK))
	if err != nil {
		return fmt.Errorf("bench: zookeeper floor: %w", err)
	}
	if f.auth != nil {
		if err := c.AddAuth("digest", f.auth); err != nil {
			c.Close()
			return fmt.Errorf("bench: zookeeper floor: adding credentials: %w", err)
		}
	}
	f.conn = c
	return nil
}

func (f *zkFloor) TryLock(_ context.Context, name, token string, ttl time.Duration) (bool, error) {
	if err := f.connect(ttl); err != nil {
		return false, err
	}
	parent := f.root + "/" + strings.ReplaceAll(name, "/", "%2F")
	node, err := f.conn.Create(parent+"/lock-", nil, zk.FlagEphemeralSequential, f.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.makeParent(parent); err != nil {
			return false, err
		}
		node, err = f.conn.Create(parent+"/lock-", nil, zk.FlagEphemeralSequential, f.acl)
	}
	if err != nil {
		return false, err
	}
	children, _, err := f.conn.Children(parent)
	if err != nil {
		return false, errors.Join(err, f.conn.Delete(node, -1))
	}
	mine := seqOf(path.Base(node))
	for _, c := range children {
		if seqOf(c) < mine {
			return false, f.conn.Delete(node, -1)
		}
	}
	f.held[token] = node
	return true, nil
}

// seqOf is the 10-digit sequence number ending a lock node's name (the same
// width for every node, so comparing the strings compares the numbers).
func seqOf(child string) string { return child[max(len(child)-10, 0):] }

func (f *zkFloor) makeParent(parent string) error {
	for i := 1; i < len(f.root); i++ {
		if f.root[i] == '/' {
			if _, err := f.conn.Create(f.root[:i], nil, 0, f.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return err
			}
		}
	}
	if _, err := f.conn.Create(f.root, nil, 0, f.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	if _, err := f.conn.CreateContainer(parent, nil, zk.FlagContainer, f.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	return nil
}

func (f *zkFloor) Unlock(_ context.Context, _, token string) error {
	node, ok := f.held[token]
	if !ok {
		return nil
	}
	delete(f.held, token)
	if err := f.conn.Delete(node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

func (f *zkFloor) Close() error {
	if f.conn != nil {
		f.conn.Close()
	}
	return nil
}
