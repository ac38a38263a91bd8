package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// errRequeue: the attempt's node is gone (its session ended, or someone
// deleted it); the wait goes on with a new node at the end of the queue.
var errRequeue = errors.New("zookeeper: the waiter's node is gone")

// node is a lock node the driver created.
type node struct {
	path  string // parent/child
	child string // its name under the parent
	czxid int64  // the zxid that created it: the fencing token
	gen   *generation
	// alone: the create left it the parent's only child (the parent's
	// stat after the multi-op that created it says so), so that it is
	// granted, whatever its kind, without a listing.
	alone bool
}

// TryAcquire enqueues a node, and takes the lock if it is first; otherwise it
// deletes the node again before it returns dlockdriver.Busy.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	return d.acquire(ctx, req, false)
}

// Acquire enqueues a node and waits, watching its predecessor, until it is
// first (dlockdriver.Waiter).
func (d *driver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	return d.acquire(ctx, req, true)
}

func (d *driver) acquire(ctx context.Context, req dlockdriver.Request, wait bool) (*dlockdriver.Grant, error) {
	s, err := d.session(ctx, req.TTL)
	if err != nil {
		return nil, err
	}
	called := time.Now()
	c := d.claim(req.Token, d.parentOf(req.Kind, req.Name), req.Kind, req.Limit, s)
	var b backoff
	for requeued := 0; ; {
		var n node
		sent := time.Now()
		n, err = d.create(ctx, s, c, []byte(req.Metadata))
		if err == nil && n.alone && s.isLive(n.gen) {
			// First in the queue, with nothing before or after it: granted
			// as of the create (see queue for when the validity counts
			// from the call instead).
			if time.Since(called) <= req.TTL*3/4 {
				sent = time.Time{}
			}
			return d.grant(s, c, n, req, sent, false), nil
		}
		if err == nil {
			var g *dlockdriver.Grant
			g, err = d.queue(ctx, s, c, n, req, wait, called)
			if err == nil {
				return g, nil // the lease keeps the session's count and the claim
			}
			if errors.Is(err, errRequeue) && (wait || requeued < 2) {
				requeued++
				continue
			}
		}
		if ctx.Err() != nil || !wait || !transient(err) || !b.sleep(ctx, nil) {
			break
		}
	}
	d.leave(c, req.TTL)
	s.unref()
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return nil, err
	}
	return nil, fmt.Errorf("zookeeper: acquiring %s: %w", c.parent, err)
}

// create adds the attempt's node under c's parent, creating the parent (and
// the root) when missing, and makes it c's tracked node. The node is
// created in a multi-op with an empty setData on the parent, whose reply
// carries the transaction's zxid: the node's czxid, without another round
// trip; its numChildren says whether the node is the only one under the
// parent (node.alone).
//
// When the outcome is lost, the node is looked for by its GUID (see find).
// A create sent for one generation may run in the next: go-zookeeper keeps
// the requests made while it reconnects and sends them on the session it
// then has, a new one when the old one expired. The node is then the new
// generation's. When ctx ends with the create in flight, its outcome is
// deleted in the background.
func (d *driver) create(ctx context.Context, s *session, c *claim, data []byte) (node, error) {
	prefix := c.prefix
	if !d.knownParent(c.parent) {
		// Most likely a new name: create its node first rather than learn
		// that it is missing from a failed create. Whatever fails here, the
		// create says again.
		_ = d.makeParent(ctx, s, c.parent)
	}
	for tries := 0; ; tries++ {
		g := s.live()
		if g == nil {
			return node{}, errNoSession
		}
		var res []zk.MultiResponse
		err := s.do(ctx, func() (err error) {
			res, err = s.multi(
				&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeralSequential},
				&zk.SetDataRequest{Path: c.parent, Version: -1},
			)
			return err
		}, func(err error) {
			// The attempt is over (its ctx ended): no other create of the
			// GUID follows, and its claim is gone or going.
			switch {
			case err == nil:
				d.reap(s, s.live(), res[0].String)
			case inDoubt(err):
				d.reapGUID(s, c.parent, c.guid)
			}
		})
		switch {
		case err == nil:
			// The node is in the generation live now (the reply came on its
			// connection), or gone with it if none is.
			n := node{path: res[0].String, child: path.Base(res[0].String), czxid: res[1].Stat.Mzxid, gen: s.live()}
			// A node alone under its parent after a create without a doubt
			// (no stray of the GUID can be there) is first.
			d.cmu.Lock()
			n.alone = res[1].Stat.NumChildren == 1 && !c.doubt
			d.cmu.Unlock()
			if n.gen == nil {
				return node{}, errNoSession
			}
			d.knowParent(c.parent, true)
			d.adopt(c, n, true)
			return n, nil
		case errors.Is(err, zk.ErrNoNode) && tries < 4:
			d.knowParent(c.parent, false)
			if err := d.makeParent(ctx, s, c.parent); err != nil {
				return node{}, err
			}
		case inDoubt(err):
			d.doubt(c)
			n, found, err := d.find(ctx, s, c)
			if err != nil || found {
				return n, err
			}
			// Not created, or gone with its session: try again.
		default:
			return node{}, err
		}
	}
}

// find looks for a node with c's GUID after a create whose outcome was lost,
// and adopts the first in the queue that is in the live generation (others
// are strays, which queue deletes); found is false when there is none.
func (d *driver) find(ctx context.Context, s *session, c *claim) (n node, found bool, err error) {
	var b backoff
	for {
		g := s.live()
		if g == nil {
			return node{}, false, errNoSession
		}
		var children []string
		err = s.do(ctx, func() (err error) {
			children, _, err = s.conn.Children(c.parent)
			return err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			return node{}, false, nil
		}
		busy := false
		if err == nil {
			for _, q := range queueOf(c.kind, children) {
				if guidOf(q.name) != c.guid {
					continue
				}
				p := c.parent + "/" + q.name
				var (
					ok bool
					st *zk.Stat
				)
				err = s.do(ctx, func() (err error) {
					ok, st, err = s.conn.Exists(p)
					return err
				}, nil)
				if err != nil {
					break
				}
				if ok && st.EphemeralOwner == g.sid && s.isLive(g) {
					n = node{path: p, child: q.name, czxid: st.Czxid, gen: g}
					if d.adopt(c, n, false) {
						return n, true, nil
					}
					busy = true // a sweep is deleting it: look again
					break
				}
			}
			if err == nil && !busy {
				return node{}, false, nil
			}
		}
		if ctx.Err() != nil || err != nil && !transient(err) || !b.sleep(ctx, nil) {
			if err == nil {
				err = ctx.Err()
			}
			return node{}, false, err
		}
	}
}

// makeParent creates the container node of a name, and the persistent
// nodes above it (the root, a kind's namespace) when they are missing.
func (d *driver) makeParent(ctx context.Context, s *session, parent string) error {
	for tries := 0; ; tries++ {
		err := s.do(ctx, func() error {
			_, err := s.conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
			return err
		}, nil)
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			d.knowParent(parent, true)
			return nil
		}
		if !errors.Is(err, zk.ErrNoNode) || tries > 0 {
			return err
		}
		// The root or the namespace is missing: create it, component by
		// component.
		up := path.Dir(parent)
		for i := 1; i <= len(up); i++ {
			if i < len(up) && up[i] != '/' {
				continue
			}
			p := up[:i]
			err := s.do(ctx, func() error {
				_, err := s.conn.Create(p, nil, 0, d.acl)
				return err
			}, nil)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return err
			}
		}
	}
}

// maxKnownParents bounds the names whose node the driver remembers as
// existing (see knownParent).
const maxKnownParents = 1 << 16

// knownParent reports whether the driver saw the node of the name at
// parent lately: then a create goes straight to it, otherwise the node is
// created first. Either way a node found missing is created (the server
// deletes an empty container node), so this only saves round trips: one
// per acquisition of a name seen before, one per new name.
func (d *driver) knownParent(parent string) bool {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	_, ok := d.parents[parent]
	return ok
}

// knowParent records whether the node at parent exists.
func (d *driver) knowParent(parent string, exists bool) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if !exists {
		delete(d.parents, parent)
		return
	}
	if _, ok := d.parents[parent]; ok {
		return
	}
	if len(d.parents) >= maxKnownParents {
		clear(d.parents) // forget them all: the next acquisitions learn again
	}
	d.parents[parent] = struct{}{}
}
