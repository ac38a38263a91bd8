package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/dlock/dlock/internal/testexport/zookeeperexport"

	"github.com/dlock/dlock"
	"github.com/go-zookeeper/zk"
)

func init() {
	zookeeperexport.SetIdleAfter = setIdleAfter
	zookeeperexport.ConnectWithOrphans = connectWithOrphans
	zookeeperexport.ConnectWithWatch = connectWithWatch
}

// setIdleAfter replaces how long an unused session stays open, for a test;
// it returns a function restoring it.
func setIdleAfter(d time.Duration) (restore func()) {
	old := idleAfter
	idleAfter = func(time.Duration) time.Duration { return d }
	return func() { idleAfter = old }
}

// connectWithOrphans is Connect, also returning a function that creates, in
// the Locker's session for ttl, a lock node under name that no acquisition
// tracks (as a create whose outcome was lost leaves one), and returns its
// path.
func connectWithOrphans(ctx context.Context, servers []string, optsAny any) (*dlock.Locker, func(ctx context.Context, name string, ttl time.Duration) (string, error), error) {
	var d *driver
	testHookConnected = func(dd *driver) { d = dd }
	defer func() { testHookConnected = nil }()
	opts, _ := optsAny.(*Options)
	l, err := Connect(ctx, servers, opts)
	if err != nil {
		return nil, nil, err
	}
	orphan := func(ctx context.Context, name string, ttl time.Duration) (string, error) {
		s, err := d.session(ctx, ttl)
		if err != nil {
			return "", err
		}
		defer s.unref()
		parent := d.parent(name)
		if err := d.makeParent(ctx, s, parent); err != nil {
			return "", err
		}
		var p string
		err = s.do(ctx, func() (err error) {
			p, err = s.conn.Create(nodePrefix(parent, "orphan"+randomGUID()), nil, zk.FlagEphemeralSequential, d.acl)
			return err
		}, nil)
		return p, err
	}
	return l, orphan, nil
}

func randomGUID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// connectWithWatch is Connect, also returning the driver's Watch and a
// function giving the server watch that Watch shares for a name (nil when
// there is none), to compare.
func connectWithWatch(ctx context.Context, servers []string, optsAny any) (*dlock.Locker, func(ctx context.Context, name string) (<-chan struct{}, func(), error), func(name string) any, error) {
	var d *driver
	testHookConnected = func(dd *driver) { d = dd }
	defer func() { testHookConnected = nil }()
	opts, _ := optsAny.(*Options)
	l, err := Connect(ctx, servers, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	shared := func(name string) any {
		d.wmu.Lock()
		defer d.wmu.Unlock()
		if w, ok := d.watches[d.parent(name)]; ok {
			return w.ev
		}
		return nil
	}
	return l, d.Watch, shared, nil
}
