package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/go-zookeeper/zk"
)

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
	ok, stat, err := s.exists(ctx, g, h.path)
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
	ok, stat, err := s.exists(ctx, g, h.path)
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

// exists reads path's stat. It is a read: a call cut by a connection that
// closed (go-zookeeper drops one whose pings go unanswered for two thirds
// of the session timeout, as on a loaded machine), or that found no server,
// is sent again once the client has reconnected, while the session g lives
// and ctx allows.
func (s *session) exists(ctx context.Context, g *generation, path string) (ok bool, stat *zk.Stat, err error) {
	var b backoff
	for {
		err = s.do(ctx, func() (err error) {
			ok, stat, err = s.conn.Exists(path)
			return err
		}, nil)
		if err == nil || !(inDoubt(err) || errors.Is(err, zk.ErrNoServer)) || !s.isLive(g) || !b.sleep(ctx, nil) {
			return ok, stat, err
		}
	}
}
