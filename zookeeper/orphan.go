package zookeeper

import (
	"errors"
	"path"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Every lock node the driver creates is the live lease's, a live waiter's,
// or deleted: the driver deletes it itself, retrying in the background
// through connection trouble until it is gone or its session has ended
// (Curator's guaranteed delete). Three things make that hold when replies are
// lost, connections drop and sessions expire:
//
//   - A claim per GUID (one acquisition's token, kept by its lease) records
//     which node under the name is the waiter's or the lease's. Any other
//     node with that GUID is a stray: a create whose reply was lost, found
//     again but already created anew, or one that went to the server late.
//     A waiter deletes the strays it sees on every listing; a claim that had
//     a doubt deletes every node with its GUID when it ends.
//   - A create whose outcome is unknown is looked for by its GUID (Curator's
//     protected mode) in the live session, and a create that ran in another
//     session than the one it was sent for (go-zookeeper sends the requests
//     queued while it reconnects on whatever session it then has, a new one
//     if the old one expired) is taken as a node of the session it ran in.
//   - When a driver's own session resumes after a disconnection, the names
//     of its claims are swept: a node of the session with a GUID no claim
//     has is deleted, a stray of a claim too.
//
// A delete of a lease's node that fails (Release, with its reply lost) leaves
// the lease valid until its ValidUntil, as dlock documents; the driver's
// expiry timer deletes the node then.

// A claim is the driver's record of the lock nodes of one GUID. It is made
// before the first create of an acquisition and ends with the acquisition
// (not granted) or with its lease.
type claim struct {
	guid   string
	parent string
	kind   dlockdriver.Kind
	prefix string // the path its nodes are created at (see kindPrefix)

	// Guarded by driver.cmu.
	s     *session    // the session the nodes are in (the lease's, after a move)
	gen   *generation // the tracked node's generation
	child string      // the tracked node's name; "" while there is none
	doubt bool        // another node with the GUID may exist
	busy  int         // sweeps deleting a stray of the GUID: adopt nothing meanwhile
}

// claim records a new acquisition of guid under parent in s, of kind k
// (limit: a semaphore's).
func (d *driver) claim(guid, parent string, k dlockdriver.Kind, limit int, s *session) *claim {
	c := &claim{guid: guid, parent: parent, kind: k, prefix: kindPrefix(k, parent, guid, limit), s: s}
	d.cmu.Lock()
	d.claims[guid] = c
	d.cmu.Unlock()
	return c
}

// adopt makes n c's tracked node. A node found again (not fresh from a
// create) is not adopted while a sweep is deleting a stray of c's GUID,
// which it may be.
func (d *driver) adopt(c *claim, n node, fresh bool) bool {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	if c.busy > 0 && !fresh {
		return false
	}
	c.child, c.gen = n.child, n.gen
	return true
}

// forget records that c's tracked node is gone.
func (d *driver) forget(c *claim) {
	d.cmu.Lock()
	c.child, c.gen = "", nil
	d.cmu.Unlock()
}

// doubt records that another node with c's GUID may exist.
func (d *driver) doubt(c *claim) {
	d.cmu.Lock()
	c.doubt = true
	d.cmu.Unlock()
}

// moved records that c's node is now in session s, generation g.
func (d *driver) moved(c *claim, s *session, g *generation) {
	d.cmu.Lock()
	c.s, c.gen = s, g
	d.cmu.Unlock()
}

// unclaim ends c. When remove is set, its tracked node is deleted; after a
// doubt, every node with its GUID. done is closed once that is over.
func (d *driver) unclaim(c *claim, remove bool) (done <-chan struct{}) {
	d.cmu.Lock()
	if d.claims[c.guid] != c {
		d.cmu.Unlock()
		return closed // ended already
	}
	delete(d.claims, c.guid)
	s, g, child, doubt := c.s, c.gen, c.child, c.doubt
	c.child, c.gen = "", nil
	d.cmu.Unlock()
	switch {
	case doubt:
		return d.reapGUID(s, c.parent, c.guid)
	case remove && child != "":
		return d.reap(s, g, c.parent+"/"+child)
	}
	return closed
}

var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// reap deletes the node at path, of generation g of s, in the background,
// retrying through connection trouble until it is gone, g has ended (an
// ephemeral node goes with its session) or the driver closes. done is
// closed when it is over.
func (d *driver) reap(s *session, g *generation, path string) <-chan struct{} {
	return d.retry(s, g, func() error { return d.remove(s, path) })
}

// reapGUID deletes, in the background, every node with the GUID guid under
// parent, in the live generation of s (the nodes of those that ended are
// gone), retrying as reap does. No create of guid may be in flight but
// those whose late outcome is taken care of (see create).
func (d *driver) reapGUID(s *session, parent, guid string) <-chan struct{} {
	return d.retry(s, s.live(), func() error {
		var children []string
		err := s.do(d.ctx, func() (err error) {
			children, _, err = s.conn.Children(parent)
			return err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err // children may still be written: do gave up at d.ctx
		}
		for _, c := range children {
			if guidOf(c) == guid {
				if err := d.remove(s, parent+"/"+c); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// remove deletes the node at path, whatever its version; nil if it is gone.
func (d *driver) remove(s *session, path string) error {
	err := s.do(d.ctx, func() error { return s.conn.Delete(path, -1) }, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// retry runs f in the background until it succeeds, fails for good, g ends
// or the driver closes, backing off after connection trouble. It holds a
// count on s meanwhile.
func (d *driver) retry(s *session, g *generation, f func() error) <-chan struct{} {
	if g == nil {
		return closed
	}
	done := make(chan struct{})
	s.ref()
	ok := d.goBG(func() {
		defer close(done)
		defer s.unref()
		var b backoff
		for s.isLive(g) {
			err := f()
			if err == nil || !transient(err) || !b.sleep(d.ctx, g.gone) {
				return
			}
		}
	})
	if !ok {
		s.unref()
		close(done)
	}
	return done
}

// resumed runs when an owned session got its connection back: it sweeps the
// names the session has claims under, once at a time (a resumption during a
// sweep runs another after it).
func (s *session) resumed() {
	s.mu.Lock()
	if s.sweeping {
		s.sweepAgain = true
		s.mu.Unlock()
		return
	}
	s.sweeping = true
	s.mu.Unlock()
	g := s.live()
	s.ref()
	ok := s.d.goBG(func() {
		defer s.unref()
		for {
			s.d.sweep(s, g)
			s.mu.Lock()
			again := s.sweepAgain
			s.sweepAgain, s.sweeping = false, again
			s.mu.Unlock()
			if !again {
				return
			}
			g = s.live()
		}
	})
	if !ok {
		s.unref()
	}
}

// sweep deletes, under the names where s has claims, the nodes of
// generation g that no claim tracks: those of GUIDs no claim has (the
// session is the driver's own, so a node in it is the driver's), and the
// strays of claims that track another node.
func (d *driver) sweep(s *session, g *generation) {
	if g == nil {
		return
	}
	parents := map[string]struct{}{}
	d.cmu.Lock()
	for _, c := range d.claims {
		if c.s == s {
			parents[c.parent] = struct{}{}
		}
	}
	d.cmu.Unlock()
	for parent := range parents {
		var b backoff
		for s.isLive(g) {
			err := d.sweepOne(s, g, parent)
			if err == nil || !transient(err) || !b.sleep(d.ctx, g.gone) {
				break
			}
		}
	}
}

func (d *driver) sweepOne(s *session, g *generation, parent string) error {
	var children []string
	err := s.do(d.ctx, func() (err error) {
		children, _, err = s.conn.Children(parent)
		return err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, child := range children {
		guid := guidOf(child)
		if guid == "" {
			continue
		}
		p := path.Join(parent, child)
		d.cmu.Lock()
		c := d.claims[guid]
		stray := c != nil && c.child != "" && c.child != child
		if stray {
			c.doubt = true
			c.busy++
		}
		d.cmu.Unlock()
		switch {
		case stray:
			err = d.remove(s, p)
			d.cmu.Lock()
			c.busy--
			d.cmu.Unlock()
		case c == nil:
			// No claim has the GUID, and none ever will again: the node is
			// an orphan if it is in this session.
			var (
				ok bool
				st *zk.Stat
			)
			err = s.do(d.ctx, func() (err error) {
				ok, st, err = s.conn.Exists(p)
				return err
			}, nil)
			if err == nil && ok && st.EphemeralOwner == g.sid {
				err = d.remove(s, p)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
