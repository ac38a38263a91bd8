package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// errNodeGone: a node of TryAcquireAll was not in its name's queue when
// listed (someone deleted it, or its session ended).
var errNodeGone = errors.New("zookeeper: a lock node was gone when its queue was listed")

// TryAcquireAll implements dlockdriver.MultiAcquirer: one multi-op creates
// every name's lock node, each with the empty write to its name's node that
// TryAcquire's create has, whose stat in the reply gives the node's czxid
// (the fence) and the name's number of children. A multi-op cannot read,
// but that number can tell: a node alone under its name is first, granted
// as TryAcquire grants it, without a listing. So an uncontended
// TryAcquireAll is one round trip, where the names one by one are one each.
// The names whose node is not alone are listed (together, pipelined on the
// connection); if any node is not first, one multi-op deletes every node
// before the attempt fails as busy, so that no name is held past it.
func (d *driver) TryAcquireAll(ctx context.Context, reqs []dlockdriver.Request) ([]*dlockdriver.Grant, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	ttl := reqs[0].TTL
	for _, req := range reqs {
		if req.Kind != dlockdriver.KindLock || req.TTL != ttl {
			return nil, fmt.Errorf("zookeeper: one multi-op for several names: %w for these requests", errors.ErrUnsupported)
		}
	}
	s, err := d.session(ctx, ttl)
	if err != nil {
		return nil, err
	}
	for range len(reqs) - 1 {
		s.ref() // a count per name: each lease keeps one
	}
	called := time.Now()
	cs := make([]*claim, len(reqs))
	for i, req := range reqs {
		cs[i] = d.claim(req.Token, d.parent(req.Name), dlockdriver.KindLock, 0, s)
	}
	sent := time.Now()
	ns, err := d.createAll(ctx, s, cs, reqs)
	var busy bool
	if err == nil {
		busy, err = d.firstAll(ctx, s, cs, ns)
	}
	switch {
	case err == nil && busy:
		d.dropAll(s, cs, ns, ttl)
		err = dlockdriver.Busy(0)
	case err == nil && !s.isLive(ns[0].gen):
		err = errNoSession
	case err == nil:
		if time.Since(called) <= ttl*3/4 {
			sent = time.Time{} // counts from the call, as TryAcquire's
		}
		gs := make([]*dlockdriver.Grant, len(reqs))
		for i, req := range reqs {
			gs[i] = d.grant(s, cs[i], ns[i], req, sent, false)
		}
		return gs, nil
	default:
		d.leaveAll(cs, ttl)
	}
	for range reqs {
		s.unref()
	}
	var busyErr *dlockdriver.BusyError
	if ctxErr := ctx.Err(); (ctxErr != nil && errors.Is(err, ctxErr)) || errors.As(err, &busyErr) {
		return nil, err
	}
	return nil, fmt.Errorf("zookeeper: acquiring %d names: %w", len(reqs), err)
}

// createAll creates the nodes of cs in one multi-op (see create, which it
// follows for one node), each with an empty write to its parent, and makes
// each its claim's tracked node. When a parent is missing, the parents are
// created and the multi-op sent again; when its outcome is lost, every claim
// is in doubt (leaveAll then deletes every node of its GUID).
func (d *driver) createAll(ctx context.Context, s *session, cs []*claim, reqs []dlockdriver.Request) ([]node, error) {
	if err := d.makeParents(ctx, s, cs, false); err != nil {
		return nil, err
	}
	ops := make([]any, 0, 2*len(cs))
	for i, c := range cs {
		ops = append(ops,
			&zk.CreateRequest{Path: c.prefix, Data: []byte(reqs[i].Metadata), Acl: d.acl, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: c.parent, Version: -1},
		)
	}
	for tries := 0; ; tries++ {
		if s.live() == nil {
			return nil, errNoSession
		}
		var res []zk.MultiResponse
		err := s.do(ctx, func() (err error) {
			res, err = s.multi(ops...)
			return err
		}, func(err error) {
			// The attempt is over (its ctx ended): delete what it made.
			switch {
			case err == nil && len(res) == len(ops):
				g := s.live()
				for i := range cs {
					d.reap(s, g, res[2*i].String)
				}
			case inDoubt(err):
				for _, c := range cs {
					d.reapGUID(s, c.parent, c.guid)
				}
			}
		})
		switch {
		case err == nil && len(res) != len(ops):
			return nil, fmt.Errorf("zookeeper: %d replies to a multi-op of %d operations", len(res), len(ops))
		case err == nil:
			g := s.live()
			ns := make([]node, len(cs))
			for i, c := range cs {
				p, st := res[2*i].String, res[2*i+1].Stat
				// Fresh claims: no stray of their GUIDs can be there.
				ns[i] = node{path: p, child: path.Base(p), czxid: st.Mzxid, gen: g, alone: st.NumChildren == 1}
				if g != nil {
					d.knowParent(c.parent, true)
					d.adopt(c, ns[i], true)
				}
			}
			if g == nil {
				return nil, errNoSession // the nodes went with their generation
			}
			return ns, nil
		case errors.Is(err, zk.ErrNoNode) && tries < 4:
			// A name's node is missing (the server deletes an empty
			// container): which one, the reply does not say.
			if err := d.makeParents(ctx, s, cs, true); err != nil {
				return nil, err
			}
		case inDoubt(err):
			for _, c := range cs {
				d.doubt(c)
			}
			return nil, err
		default:
			return nil, err
		}
	}
}

// makeParents creates the nodes of the names of cs (all of them, or those
// not known to exist), at once.
func (d *driver) makeParents(ctx context.Context, s *session, cs []*claim, all bool) error {
	var parents []string
	for _, c := range cs {
		if all || !d.knownParent(c.parent) {
			parents = append(parents, c.parent)
		}
	}
	if len(parents) == 0 {
		return nil
	}
	errs := make([]error, len(parents))
	var wg sync.WaitGroup
	for i, p := range parents {
		wg.Go(func() { errs[i] = d.makeParent(ctx, s, p) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// firstAll reports whether every node of ns is first in its name's queue
// (busy: one is not), listing the names whose node was not alone.
func (d *driver) firstAll(ctx context.Context, s *session, cs []*claim, ns []node) (busy bool, _ error) {
	errs := make([]error, len(ns))
	first := make([]bool, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		if n.alone {
			first[i] = true
			continue
		}
		wg.Go(func() {
			var children []string
			errs[i] = s.do(ctx, func() (err error) {
				children, _, err = s.conn.Children(cs[i].parent)
				return err
			}, nil)
			if errs[i] != nil {
				return
			}
			q := queue(children)
			switch {
			case len(q) > 0 && q[0].name == n.child:
				first[i] = true
			case !slices.ContainsFunc(q, func(e contender) bool { return e.name == n.child }):
				errs[i] = errNodeGone
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	return slices.Contains(first, false), nil
}

// dropAll deletes the nodes of a TryAcquireAll that found a name busy, in
// one multi-op, and ends their claims; a node that multi-op did not delete
// is deleted as leave deletes an attempt's (waiting up to half the TTL, at
// most a second).
func (d *driver) dropAll(s *session, cs []*claim, ns []node, ttl time.Duration) {
	ops := make([]any, len(ns))
	for i, n := range ns {
		ops[i] = &zk.DeleteRequest{Path: n.path, Version: -1}
	}
	ctx, cancel := context.WithTimeout(d.ctx, min(ttl/2, time.Second))
	err := s.do(ctx, func() error {
		_, err := s.multi(ops...)
		return err
	}, nil)
	cancel()
	if err == nil {
		for _, c := range cs {
			d.forget(c) // deleted: leaveAll has nothing left to delete
		}
	}
	d.leaveAll(cs, ttl)
}

// leaveAll is leave for the claims of one TryAcquireAll, at once.
func (d *driver) leaveAll(cs []*claim, ttl time.Duration) {
	dones := make([]<-chan struct{}, len(cs))
	for i, c := range cs {
		dones[i] = d.unclaim(c, true)
	}
	t := time.NewTimer(min(ttl/2, time.Second))
	defer t.Stop()
	for _, done := range dones {
		select {
		case <-done:
		case <-t.C:
			return
		}
	}
}

var _ dlockdriver.MultiAcquirer = (*driver)(nil)
