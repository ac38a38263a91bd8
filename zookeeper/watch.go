package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Watch tells when the lock name may have become free
// (dlockdriver.Notifier): a watch on the children of the name's node,
// which fires when a lock node goes (released, or gone with its session) or
// comes. The Locker waits through Acquire (dlockdriver.Waiter); Watch
// serves Observe.
//
// go-zookeeper cannot remove a watch, so watches of a name share one
// server watch while it has not fired: an observer that looks again every
// second under a leader that stays for hours adds nothing.
func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	s, err := d.anySession(ctx)
	if err != nil {
		return nil, nil, err
	}
	parent := d.parent(name)
	ev, err := d.childWatch(ctx, s, parent)
	if err != nil {
		s.unref()
		return nil, nil, fmt.Errorf("zookeeper: watching %s: %w", parent, err)
	}
	out := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(stopped) }) }
	if !d.goBG(func() {
		defer s.unref()
		select {
		case <-ev:
			d.wmu.Lock()
			if w, ok := d.watches[parent]; ok && w.ev == ev {
				delete(d.watches, parent)
			}
			d.wmu.Unlock()
			close(out)
		case <-stopped:
		case <-d.ctx.Done():
			close(out)
		}
	}) {
		s.unref()
		close(out)
	}
	return out, stop, nil
}

// childWatch is a watch on the children of parent in s: the one in place,
// if it has not fired, or a new one. When parent does not exist, the watch
// is on its creation.
func (d *driver) childWatch(ctx context.Context, s *session, parent string) (<-chan zk.Event, error) {
	d.wmu.Lock()
	if w, ok := d.watches[parent]; ok && w.s == s {
		select {
		case <-w.ev: // fired (go-zookeeper closes the channel after its event)
		default:
			d.wmu.Unlock()
			return w.ev, nil
		}
	}
	delete(d.watches, parent)
	d.wmu.Unlock()
	for {
		var ev <-chan zk.Event
		err := s.do(ctx, func() (err error) {
			_, _, ev, err = s.conn.ChildrenW(parent)
			return err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			var ok bool
			err = s.do(ctx, func() (err error) {
				ok, _, ev, err = s.conn.ExistsW(parent)
				return err
			}, nil)
			if err == nil && ok {
				continue // created meanwhile: watch its children
			}
		}
		if err != nil {
			return nil, err
		}
		d.wmu.Lock()
		d.watches[parent] = childWatch{s: s, ev: ev}
		d.wmu.Unlock()
		return ev, nil
	}
}

// childWatch is a watch of childWatch's, shared while it has not fired.
type childWatch struct {
	s  *session
	ev <-chan zk.Event
}

var _ dlockdriver.Notifier = (*driver)(nil)
