package zookeeper

import (
	"context"
	"errors"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

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
	w := &queueWait{d: d, s: s, c: c, n: n, req: req, wait: wait, called: called}
	for {
		g, next, err := w.look(ctx)
		switch next {
		case lookAgain:
			continue
		case lookDone:
			return g, err
		}
		// lookFailed: a request failed, or ctx ended during the wait.
		if !s.isLive(n.gen) {
			d.forget(c)
			return nil, errRequeue
		}
		if ctx.Err() != nil || !wait || !transient(err) || !w.b.sleep(ctx, n.gen.gone) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
	}
}

// lookNext is what queue does after one look at the queue.
type lookNext int

const (
	lookDone   lookNext = iota // return the grant or the error
	lookAgain                  // look again at once
	lookFailed                 // a request failed, or ctx ended: retry after a backoff, or give up
)

// queueWait is the state of one queue call across its looks.
type queueWait struct {
	d      *driver
	s      *session
	c      *claim
	n      node
	req    dlockdriver.Request
	wait   bool
	called time.Time

	b        backoff
	waited   bool // a listing found n not granted
	children bool // list with a watch on the parent's children (see place)
}

// watchSet is what a look that waits watches (see arm).
type watchSet struct {
	watch <-chan zk.Event
	early bool            // granted when the watched node is deleted (see firstNow)
	own   <-chan zk.Event // early: the exists watch on n
	armed time.Time       // when the watches were asked for
	epoch uint64          // the connection they were set on
}

// look lists the queue once and grants n, refuses it, or waits for what can
// grant it to change.
func (w *queueWait) look(ctx context.Context) (*dlockdriver.Grant, lookNext, error) {
	s, c, n, req := w.s, w.c, w.n, w.req
	sent := time.Now()
	var (
		list   []string
		listed <-chan zk.Event
	)
	children := w.children
	err := s.do(ctx, func() (err error) {
		if children {
			list, _, listed, err = s.conn.ChildrenW(c.parent)
			return err
		}
		list, _, err = s.conn.Children(c.parent)
		return err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		// The name's node is gone, so is n: deleted by someone else, and
		// the emptied container by the server.
		w.d.knowParent(c.parent, false)
		w.d.forget(c)
		return nil, lookDone, errRequeue
	}
	if err != nil {
		return nil, lookFailed, err
	}
	if !s.isLive(n.gen) {
		w.d.forget(c)
		return nil, lookDone, errRequeue
	}
	q, i, again := w.position(list)
	if again {
		return nil, lookAgain, nil
	}
	if i < 0 { // deleted by someone else
		w.d.forget(c)
		return nil, lookDone, errRequeue
	}
	v := place(req, q, i)
	switch {
	case v.err != nil:
		return nil, lookDone, v.err
	case v.granted:
		if time.Since(w.called) <= req.TTL*3/4 {
			sent = time.Time{}
		}
		// A permit node with nodes behind it marks its grant (see
		// place); so does a lock node that waited, when it carries
		// metadata: the mtime Inspect reports is then the grant's.
		touch := req.Kind == dlockdriver.KindPermit && i+1 < len(q) ||
			req.Kind == dlockdriver.KindLock && w.waited && req.Metadata != ""
		return w.d.grant(s, c, n, req, sent, touch), lookDone, nil
	case !w.wait:
		return nil, lookDone, dlockdriver.Busy(0)
	}
	w.waited = true
	ws, again, err := w.arm(ctx, v, i, listed)
	switch {
	case again:
		return nil, lookAgain, nil
	case err != nil:
		return nil, lookFailed, err
	}
	return w.await(ctx, ws)
}

// position finds n in the listed queue of its kind (i < 0: it is not
// there). Strays of c's GUID the listing shows are deleted here, before the
// wait: one of them may be the node n would wait for. again: they were, and
// n was not first, so look again.
func (w *queueWait) position(list []string) (q []contender, i int, again bool) {
	q = queueOf(w.req.Kind, list)
	i = -1
	strays := 0
	for j, e := range q {
		switch {
		case e.name == w.n.child:
			i = j
		case guidOf(e.name) == w.c.guid:
			strays++
		}
	}
	if strays > 0 {
		w.d.doubt(w.c)
		var rerr error
		for _, e := range q {
			if rerr == nil && e.name != w.n.child && guidOf(e.name) == w.c.guid {
				rerr = w.d.remove(w.s, w.c.parent+"/"+e.name)
			}
		}
		if rerr == nil && i > 0 {
			return q, i, true
		}
	}
	return q, i, false
}

// arm sets the watch of a waiting node at q[i] judged v: the parent's
// children (listed, the listing's watch, once the listing set it), or the
// predecessor v names, and, for the first waiter of a lock or write lock
// on an owned session, an exists watch on n itself (see firstNow). again:
// look again at once (the listing must set the watch, the predecessor is
// gone or, for a permit, granted since the listing, or n is gone).
func (w *queueWait) arm(ctx context.Context, v verdict, i int, listed <-chan zk.Event) (watchSet, bool, error) {
	s, c, n, req := w.s, w.c, w.n, w.req
	if v.children {
		if !w.children {
			w.children = true
			return watchSet{}, true, nil // list again, watching the children
		}
		return watchSet{watch: listed}, false, nil
	}
	pred := c.parent + "/" + v.watch
	// A session of the driver's own only: the application's connection
	// tells no reconnection (see firstNow).
	early := s.owned && i == 1 && (req.Kind == dlockdriver.KindLock || req.Kind == dlockdriver.KindWrite) && !w.d.doubted(c)
	// Written by the call, which do may abandon to ctx and which then
	// writes them later: read only once do returned nil.
	var (
		st         *zk.Stat
		watch, own <-chan zk.Event
		there      bool // n, with an exists watch on it (early)
	)
	g0, epoch := s.connEpoch()
	armed := time.Now()
	err := s.do(ctx, func() (err error) {
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
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return watchSet{}, true, nil // gone already: look again
	case err != nil:
		return watchSet{}, false, err
	case req.Kind == dlockdriver.KindPermit && st.Version > 0:
		return watchSet{}, true, nil // granted since the listing: look again
	case early && !there:
		return watchSet{}, true, nil // n is gone: the listing says so
	}
	if early {
		if g1, e1 := s.connEpoch(); g0 != n.gen || g1 != g0 || e1 != epoch {
			early = false // reconnected meanwhile: list as usual
		}
	}
	return watchSet{watch: watch, early: early, own: own, armed: armed, epoch: epoch}, false, nil
}

// await waits for ws's watch to fire, for n's generation to end, or for
// ctx. A deletion of the predecessor grants n at once when ws.early allows
// (see firstNow); any other event means look again.
func (w *queueWait) await(ctx context.Context, ws watchSet) (*dlockdriver.Grant, lookNext, error) {
	s, c, n, req := w.s, w.c, w.n, w.req
	w.b = backoff{}
	select {
	case ev := <-ws.watch: // deleted or changed, or the watch was dropped: look again
		if ws.early && ev.Type == zk.EventNodeDeleted && w.d.firstNow(s, n, ws.own, ws.epoch) && time.Since(ws.armed) <= req.TTL/2 {
			// Granted: see firstNow. The validity counts from the
			// call, or from the request that set the watches.
			sent := ws.armed
			if time.Since(w.called) <= req.TTL*3/4 {
				sent = time.Time{}
			}
			touch := req.Kind == dlockdriver.KindLock && req.Metadata != ""
			return w.d.grant(s, c, n, req, sent, touch), lookDone, nil
		}
		return nil, lookAgain, nil
	case <-n.gen.gone:
		w.d.forget(c)
		return nil, lookDone, errRequeue
	case <-ctx.Done():
		return nil, lookFailed, ctx.Err()
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
// a doubt, every node with its GUID), waiting for that up to leaveGrace (or
// half the TTL, if shorter); the deletion carries on in the background after
// that. An Acquire whose ctx ended returns that soon after it, even when the
// server does not answer.
func (d *driver) leave(c *claim, ttl time.Duration) {
	done := d.unclaim(c, true)
	t := time.NewTimer(min(ttl/2, leaveGrace))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// leaveGrace bounds leave's wait for the deletion of the node.
const leaveGrace = 250 * time.Millisecond

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
