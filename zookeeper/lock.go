package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/dlock/dlock"
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

// queue waits until n, c's node, is granted (or, without wait, finds out
// whether it is), watching only what can grant it (see place). Every
// listing deletes the strays of c's GUID it shows. When it returns without a
// grant, n is still c's tracked node (acquire deletes it) unless the error
// is errRequeue: n is gone.
//
// The lease's validity counts from the call (Grant.Sent zero: the most
// conservative choice) when the grant came within three quarters of the TTL
// of it; otherwise (after a wait, or reconnecting) from the listing that
// found n granted, or, for a grant on a deletion event (see firstNow), from
// the requests that set the watches (at most half the TTL before). Each is
// safe: every request on the session, sent at that time or later, restarted
// its timeout on the server.
func (d *driver) queue(ctx context.Context, s *session, c *claim, n node, req dlockdriver.Request, wait bool, called time.Time) (*dlockdriver.Grant, error) {
	var (
		b        backoff
		waited   bool // a listing found n not granted
		children bool // list with a watch on the parent's children (see place)
	)
	for {
		sent := time.Now()
		var (
			list   []string
			listed <-chan zk.Event
			early  bool            // granted when the watched node is deleted (see firstNow)
			own    <-chan zk.Event // early: the exists watch on n
			armed  time.Time       // when the watches were asked for
			epoch  uint64          // the connection they were set on
		)
		err := s.do(ctx, func() (err error) {
			if children {
				list, _, listed, err = s.conn.ChildrenW(c.parent)
				return err
			}
			list, _, err = s.conn.Children(c.parent)
			return err
		}, nil)
		if err == nil {
			if !s.isLive(n.gen) {
				d.forget(c)
				return nil, errRequeue
			}
			q := queueOf(req.Kind, list)
			i := -1
			strays := 0
			for j, e := range q {
				switch {
				case e.name == n.child:
					i = j
				case guidOf(e.name) == c.guid:
					strays++
				}
			}
			if strays > 0 {
				// Deleted here, before the wait: one of them may be the node
				// this one would wait for.
				d.doubt(c)
				var rerr error
				for _, e := range q {
					if rerr == nil && e.name != n.child && guidOf(e.name) == c.guid {
						rerr = d.remove(s, c.parent+"/"+e.name)
					}
				}
				if rerr == nil && i > 0 {
					continue // look again
				}
			}
			if i < 0 { // deleted by someone else
				d.forget(c)
				return nil, errRequeue
			}
			v := place(req, q, i)
			switch {
			case v.err != nil:
				return nil, v.err
			case v.granted:
				if time.Since(called) <= req.TTL*3/4 {
					sent = time.Time{}
				}
				// A permit node with nodes behind it marks its grant (see
				// place); so does a lock node that waited, when it carries
				// metadata: the mtime Inspect reports is then the grant's.
				touch := req.Kind == dlockdriver.KindPermit && i+1 < len(q) ||
					req.Kind == dlockdriver.KindLock && waited && req.Metadata != ""
				return d.grant(s, c, n, req, sent, touch), nil
			case !wait:
				return nil, dlockdriver.Busy(0)
			}
			waited = true
			var watch <-chan zk.Event
			if v.children {
				if !children {
					children = true
					continue // list again, watching the children
				}
				watch = listed
			} else {
				pred := c.parent + "/" + v.watch
				// A session of the driver's own only: the application's
				// connection tells no reconnection (see firstNow).
				early = s.owned && i == 1 && (req.Kind == dlockdriver.KindLock || req.Kind == dlockdriver.KindWrite) && !d.doubted(c)
				var (
					st    *zk.Stat
					there bool // n, with an exists watch on it (early)
				)
				var g0 *generation
				g0, epoch = s.connEpoch()
				armed = time.Now()
				err = s.do(ctx, func() (err error) {
					if !early {
						_, st, watch, err = s.conn.GetW(pred)
						return err
					}
					var ownErr error
					done := make(chan struct{})
					go func() {
						defer close(done)
						there, _, own, ownErr = s.conn.ExistsW(n.path)
					}()
					_, st, watch, err = s.conn.GetW(pred)
					<-done
					if err == nil {
						err = ownErr
					}
					return err
				}, nil)
				if errors.Is(err, zk.ErrNoNode) {
					continue // gone already: look again
				}
				if err == nil && req.Kind == dlockdriver.KindPermit && st.Version > 0 {
					continue // granted since the listing: look again
				}
				if err == nil && early {
					if !there {
						continue // n is gone: the listing says so
					}
					if g1, e1 := s.connEpoch(); g0 != n.gen || g1 != g0 || e1 != epoch {
						early = false // reconnected meanwhile: list as usual
					}
				}
			}
			if err == nil {
				b = backoff{}
				select {
				case ev := <-watch: // deleted or changed, or the watch was dropped: look again
					if early && ev.Type == zk.EventNodeDeleted && d.firstNow(s, n, own, epoch) && time.Since(armed) <= req.TTL/2 {
						// Granted: see firstNow. The validity counts from the
						// call, or from the request that set the watches.
						sent = armed
						if time.Since(called) <= req.TTL*3/4 {
							sent = time.Time{}
						}
						touch := req.Kind == dlockdriver.KindLock && req.Metadata != ""
						return d.grant(s, c, n, req, sent, touch), nil
					}
					continue
				case <-n.gen.gone:
					d.forget(c)
					return nil, errRequeue
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
		}
		if !s.isLive(n.gen) {
			d.forget(c)
			return nil, errRequeue
		}
		if ctx.Err() != nil || !wait || !transient(err) || !b.sleep(ctx, n.gen.gone) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
	}
}

// firstNow reports, as the node the first waiter of a lock or of a write
// lock (n, one node ahead of it at the listing) watches is deleted, that n
// is now first, without listing the queue again. No node can come ahead of
// n: a new node's sequence number is above every earlier one's, and a node
// the driver moves into another session (Refresh with another TTL) keeps
// its name, but has its data written in the same multi-op before it is
// deleted, which fires a watch on it as a change, not a deletion (see
// migrate). n itself is still there, in the live generation: the exists
// watch on it (own) has not fired, and the server sends a connection's
// watch events in the order of its changes, so n's deletion would have been
// told first — on the connection (epoch) that set both watches; after a
// reconnection go-zookeeper sets them again in one request, whose events
// come in any order, so the waiter lists the queue as usual. Only an owned
// session counts its connections: on the application's connection (New)
// the waiter always lists.
func (d *driver) firstNow(s *session, n node, own <-chan zk.Event, epoch uint64) bool {
	select {
	case <-own:
		return false
	default:
	}
	g, e := s.connEpoch()
	return g == n.gen && e == epoch
}

// doubted reports whether another node with c's GUID may exist.
func (d *driver) doubted(c *claim) bool {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	return c.doubt
}

// verdict is what a listing says of a node: granted, or what to watch
// while it waits, or why it must not wait (a semaphore's limit mismatch).
type verdict struct {
	granted  bool
	watch    string // the child to watch
	children bool   // watch the parent's children instead
	err      error
}

// place judges the node at q[i], by kind:
//
//   - A lock node is granted when it is first, and watches its
//     predecessor (each release wakes exactly one waiter).
//   - A write node likewise: it is granted when no node of either side is
//     ahead of it, and watches its predecessor. Readers behind it wait, so
//     a waiting writer keeps new readers out.
//   - A read node is granted when no write node is ahead of it, and watches
//     the nearest write node ahead of it (the last of them to go).
//   - A permit node is granted when fewer than its limit of permit nodes
//     are ahead of it; any node ahead with another limit refuses it
//     (LimitMismatch). The first waiter (exactly limit nodes ahead) watches
//     the parent's children: the next permit to come back may be any of
//     the limit ahead of it. A waiter further back watches its predecessor,
//     which wakes it when it goes or when it is granted: a permit node
//     granted with nodes behind it writes its data once (see queue), so
//     that the waiter behind it, now first, starts watching the children.
//     Watching the node limit places ahead would not do: a node between
//     the two may go first, leaving the watcher entitled but asleep.
func place(req dlockdriver.Request, q []contender, i int) verdict {
	switch req.Kind {
	case dlockdriver.KindRead:
		for j := i - 1; j >= 0; j-- {
			if q[j].write {
				return verdict{watch: q[j].name}
			}
		}
		return verdict{granted: true}
	case dlockdriver.KindPermit:
		for _, e := range q[:i] {
			if e.limit != req.Limit {
				return verdict{err: dlockdriver.LimitMismatch(req.Name, req.Limit, e.limit)}
			}
		}
		switch {
		case i < req.Limit:
			return verdict{granted: true}
		case i == req.Limit:
			return verdict{children: true}
		}
	}
	if i == 0 {
		return verdict{granted: true}
	}
	return verdict{watch: q[i-1].name}
}

// leave ends an acquisition that was not granted: it deletes its node (after
// a doubt, every node with its GUID), waiting for that up to half the TTL (at
// most a second); the deletion carries on in the background after that.
func (d *driver) leave(c *claim, ttl time.Duration) {
	done := d.unclaim(c, true)
	t := time.NewTimer(min(ttl/2, time.Second))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// grant makes the lease's handle for n, granted as of a listing sent at
// sent (zero: the lease counts from the call). The handle keeps the claim.
// touch: the node's data is written again (the same data) in the
// background, so that the waiter behind it wakes (a permit) or its mtime
// records the grant (a lock that waited); the handle's later deletes wait
// for that write and use the version it leaves.
func (d *driver) grant(s *session, c *claim, n node, req dlockdriver.Request, sent time.Time, touch bool) *dlockdriver.Grant {
	ttl := req.TTL
	if s.owned {
		ttl = n.gen.timeout
	}
	h := &handle{d: d, c: c, path: n.path, data: []byte(req.Metadata), lost: make(chan struct{}), s: s, gen: n.gen, ttl: ttl, touched: closed}
	expireAt := sent
	if expireAt.IsZero() {
		expireAt = time.Now()
	}
	h.mu.Lock()
	h.expiry = time.AfterFunc(time.Until(expireAt.Add(ttl)), h.expire)
	h.mu.Unlock()
	d.track(h)
	if !s.register(h, n.gen) {
		h.gone(n.gen)
	}
	if touch {
		done := d.retry(s, n.gen, func() error {
			var st *zk.Stat
			err := s.do(d.ctx, func() (err error) {
				st, err = s.conn.Set(h.path, h.data, -1)
				return err
			}, nil)
			h.mu.Lock()
			switch {
			case err == nil:
				h.version = st.Version
			case inDoubt(err):
				h.version = -1 // perhaps applied: until a write says
			}
			h.mu.Unlock()
			return err
		})
		h.mu.Lock()
		h.touched = done
		h.mu.Unlock()
	}
	var fence uint64
	if req.Kind == dlockdriver.KindLock || req.Kind == dlockdriver.KindWrite {
		fence = uint64(n.czxid)
	}
	return &dlockdriver.Grant{Handle: h, Fence: fence, TTL: ttl, Sent: sent}
}

type handleState int

const (
	held handleState = iota
	released
	dropped // lost: deleted by the expiry timer, gone with its session, or missing
)

// handle is one lease's lock node.
type handle struct {
	d    *driver
	c    *claim // ended (unclaimed) when the handle is
	path string
	data []byte
	lost chan struct{} // closed when the node's session ends, before onLost is called

	mu     sync.Mutex
	onLost func()   // called once lost is closed (dlockdriver.LossNotifier)
	s      *session // holds a count for the handle while held
	gen    *generation
	ttl    time.Duration
	expiry *time.Timer // deletes the node a TTL after the last refresh was sent
	state  handleState

	// touched is closed once the grant's write of the node's data is over
	// (see grant): closed at once when there was none. version is the
	// node's data version for deletes: 0 as created, the write's version
	// after it, and -1 (any) when that write may have been applied twice
	// or not at all.
	touched <-chan struct{}
	version int32

	// The exists watch on the node (see batch.go): nil until a batched
	// refresh sets it, and after it fired; watchEpoch is the connection
	// it was set on (0: unknown), rearms how many times it was set again
	// while an earlier one had not fired.
	watch      <-chan zk.Event
	watchEpoch uint64
	rearms     int
}

// expire runs when the TTL has passed since the last refresh was sent
// without another one: the lease has ended (its ValidUntil was earlier), but
// the session lives on, pinged by go-zookeeper, and with it the node. Delete
// it.
func (h *handle) expire() {
	h.mu.Lock()
	if h.state != held {
		h.mu.Unlock()
		return
	}
	h.state = dropped
	s, g := h.s, h.gen
	h.mu.Unlock()
	s.unregister(h, g)
	h.d.untrack(h)
	h.d.unclaim(h.c, true)
	s.unref()
}

// gone runs when generation g has ended: if the lease's node was in it, the
// lease is lost.
func (h *handle) gone(g *generation) {
	h.mu.Lock()
	if h.state != held || h.gen != g {
		h.mu.Unlock()
		return
	}
	h.state = dropped
	h.expiry.Stop()
	s := h.s
	close(h.lost)
	onLost := h.onLost
	h.mu.Unlock()
	if onLost != nil {
		onLost()
	}
	h.d.untrack(h)
	h.d.unclaim(h.c, false) // the node went with its generation
	s.unref()
}

// OnLost implements dlockdriver.LossNotifier: f is called when the node's session
// ends (see gone), at once if it has already.
func (h *handle) OnLost(f func()) {
	h.mu.Lock()
	select {
	case <-h.lost:
		h.mu.Unlock()
		f()
		return
	default:
	}
	h.onLost = f
	h.mu.Unlock()
}

// finish ends a held handle as released or dropped.
func (h *handle) finish(st handleState) {
	h.mu.Lock()
	if h.state != held {
		h.mu.Unlock()
		return
	}
	h.state = st
	h.expiry.Stop()
	s, g := h.s, h.gen
	h.mu.Unlock()
	s.unregister(h, g)
	h.d.untrack(h)
	h.d.unclaim(h.c, false)
	s.unref()
}

func (h *handle) stopTimer() {
	h.mu.Lock()
	h.expiry.Stop()
	h.mu.Unlock()
}

// current returns the handle's state, session and generation.
func (h *handle) current() (handleState, *session, *generation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state, h.s, h.gen
}

func (h *handle) notHeld(why string) error {
	return fmt.Errorf("%w: zookeeper: %s %s", dlock.ErrNotHeld, h.path, why)
}

// Refresh checks that the node is still there and in the lease's session,
// and moves the expiry timer. A TTL other than the session's moves the node
// into a session with that timeout.
func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	st, s, g := h.current()
	if st != held {
		return 0, h.notHeld("was deleted (its TTL passed, or its session ended)")
	}
	if s.owned && (ttl+time.Millisecond-1)/time.Millisecond != time.Duration(s.key) {
		return h.migrate(ctx, ttl)
	}
	if !s.owned && ttl > s.timeout {
		return 0, invalid("TTL %v is above the connection's session timeout %v", ttl, s.timeout)
	}
	sent := time.Now()
	if !s.isLive(g) {
		return 0, h.notHeld("went with its session")
	}
	var (
		ok   bool
		stat *zk.Stat
	)
	err := s.do(ctx, func() (err error) {
		ok, stat, err = s.conn.Exists(h.path)
		return err
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("zookeeper: refreshing %s: %w", h.path, err)
	}
	if !ok || stat.EphemeralOwner != g.sid {
		h.drop(ok)
		return 0, h.notHeld("is gone, or no longer in the lease's session")
	}
	granted := ttl
	if s.owned {
		granted = g.timeout
	}
	live := s.isLive(g) // not under h.mu: it may end g, which locks h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != held || h.gen != g || !live {
		return 0, h.notHeld("was deleted (its TTL passed, or its session ended)")
	}
	h.ttl = granted
	h.expiry.Reset(time.Until(sent.Add(granted)))
	return granted, nil
}

// drop ends a lease whose node is missing or not in its session (deleting
// it when it still exists).
func (h *handle) drop(exists bool) {
	_, s, g := h.current()
	if exists {
		h.d.reap(s, g, h.path)
	}
	h.finish(dropped)
}

// migrate moves the node into the session for ttl: one multi-op on that
// session deletes it and creates it again, same name, same data, as an
// ephemeral node of the new session. Its place in the queue (the sequence
// number in its name) and the lease's fencing token stay.
func (h *handle) migrate(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ns, err := h.d.session(ctx, ttl)
	if err != nil {
		return 0, err
	}
	ng := ns.live()
	st, old, og := h.current()
	switch {
	case st != held:
		ns.unref()
		return 0, h.notHeld("was deleted (its TTL passed, or its session ended)")
	case ng == nil:
		ns.unref()
		return 0, fmt.Errorf("zookeeper: refreshing %s: %w", h.path, errNoSession)
	}
	sent := time.Now()
	apply := func(err error) (time.Duration, error) {
		switch {
		case err == nil:
			cur := ns.live()
			h.mu.Lock()
			if cur != ng || h.state != held || h.gen != og {
				h.mu.Unlock()
				// The lease ended meanwhile, or the node was created again in
				// another generation than ng (go-zookeeper sends a request
				// made while it reconnects on the session it then has), or
				// gone with ng: the node is nobody's.
				h.d.reap(ns, cur, h.path)
				ns.unref()
				h.finish(dropped)
				return 0, h.notHeld("was deleted (its TTL passed, or its session ended)")
			}
			h.s, h.gen, h.ttl, h.version = ns, ng, ng.timeout, 0
			h.watch, h.watchEpoch, h.rearms = nil, 0, 0 // the old one fires (the node was deleted) on the old session
			h.expiry.Reset(time.Until(sent.Add(ng.timeout)))
			h.mu.Unlock()
			h.d.moved(h.c, ns, ng)
			old.unregister(h, og)
			if !ns.register(h, ng) {
				h.gone(ng)
			}
			old.unref()
			return ng.timeout, nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			ns.unref()
			h.finish(dropped)
			return 0, h.notHeld("is gone")
		}
		// Perhaps applied, perhaps not: if it was, the next refresh finds the
		// node in another session and the lease ends as lost (the expiry
		// timer deletes the node).
		ns.unref()
		return 0, fmt.Errorf("zookeeper: moving %s to a session of %v: %w", h.path, ttl, err)
	}
	version, err := h.deleteVersion(ctx)
	if err != nil {
		ns.unref()
		return 0, fmt.Errorf("zookeeper: moving %s to a session of %v: %w", h.path, ttl, err)
	}
	err = ns.do(ctx, func() error {
		_, err := ns.conn.Multi(
			// Written before it is deleted: a waiter watching it wakes to a
			// change, and lists the queue, rather than to a deletion, which
			// would grant it at once (see firstNow).
			&zk.SetDataRequest{Path: h.path, Data: h.data, Version: version},
			&zk.DeleteRequest{Path: h.path, Version: -1},
			&zk.CreateRequest{Path: h.path, Data: h.data, Acl: h.d.acl, Flags: zk.FlagEphemeral},
		)
		return err
	}, func(err error) { _, _ = apply(err) })
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return 0, fmt.Errorf("zookeeper: moving %s to a session of %v: %w", h.path, ttl, err)
	}
	return apply(err)
}

// deleteVersion waits for the grant's write of the node's data, if any
// (bounded by ctx), and returns the version to delete the node with.
func (h *handle) deleteVersion(ctx context.Context) (int32, error) {
	h.mu.Lock()
	touched := h.touched
	h.mu.Unlock()
	select {
	case <-touched:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.version, nil
}

// Release deletes the node, with the version it has (see handle.version).
func (h *handle) Release(ctx context.Context) error {
	st, s, g := h.current()
	switch {
	case st == released:
		return nil
	case st == dropped:
		return h.notHeld("was deleted (its TTL passed, or its session ended)")
	case !s.isLive(g):
		return h.notHeld("went with its session")
	}
	version, err := h.deleteVersion(ctx)
	if err != nil {
		return fmt.Errorf("zookeeper: releasing %s: %w", h.path, err)
	}
	err = s.do(ctx, func() error { return s.deleteNode(h.path, version) }, func(err error) { _ = h.released(err) })
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("zookeeper: releasing %s: %w", h.path, err)
	}
	return h.released(err)
}

// released applies the outcome of a release's Delete.
func (h *handle) released(err error) error {
	switch {
	case err == nil:
		h.finish(released)
		return nil
	case errors.Is(err, zk.ErrNoNode):
		h.finish(dropped)
		return h.notHeld("is gone")
	case errors.Is(err, zk.ErrBadVersion):
		h.finish(dropped)
		return h.notHeld("was changed by someone else: left in place")
	}
	return fmt.Errorf("zookeeper: releasing %s: %w", h.path, err)
}

// Held reads the node: there, and in the lease's live session.
func (h *handle) Held(ctx context.Context) (bool, error) {
	st, s, g := h.current()
	if st != held || !s.isLive(g) {
		return false, nil
	}
	var (
		ok   bool
		stat *zk.Stat
	)
	err := s.do(ctx, func() (err error) {
		ok, stat, err = s.conn.Exists(h.path)
		return err
	}, nil)
	if err != nil {
		return false, fmt.Errorf("zookeeper: reading %s: %w", h.path, err)
	}
	if !ok || stat.EphemeralOwner != g.sid || !s.isLive(g) {
		h.drop(ok && stat.EphemeralOwner != g.sid)
		return false, nil
	}
	return true, nil
}

// deleteOnClose deletes a held node as the Locker closes (the application's
// connection only: the driver's own sessions take their nodes with them).
func (h *handle) deleteOnClose(ctx context.Context) {
	st, s, _ := h.current()
	if st != held {
		return
	}
	version, err := h.deleteVersion(ctx)
	if err == nil {
		err = s.do(ctx, func() error { return s.deleteNode(h.path, version) }, nil)
	}
	if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		h.finish(released)
		return
	}
	h.finish(dropped)
}
