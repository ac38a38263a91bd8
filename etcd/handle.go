package etcd

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// handle is one held lease: its key, the key's create revision and the etcd
// lease it is bound to. The Locker serialises its calls.
type handle struct {
	d     *driver
	key   string
	rev   int64 // the key's create revision: the fence
	value string
	l     *lease
	// moving is the etcd lease of a move to a longer TTL whose outcome is
	// unknown (the reply was lost) or not known yet: the key may be bound
	// to it.
	moving *lease

	// For a key on a shared etcd lease (shared.go), under d.reg.mu (as are
	// writes of rev, l and moving once registered):
	pending   []*clientv3.Event // events on the key before its rev was known
	lostWhy   string            // why the watch found the lock gone
	onLost    func()
	until     time.Time // the end of its own TTL, unless refreshed
	waiting   bool      // a waiter's key, kept alive by its wait
	abandoned bool      // to be deleted by the watch loop
	releasing bool      // its release is in flight: events wait in pending
}

// setLeases sets the etcd leases the key may be bound to.
func (h *handle) setLeases(l, moving *lease) {
	h.d.reg.mu.Lock()
	h.l, h.moving = l, moving
	h.d.reg.mu.Unlock()
}

// isOurs compares the key's create revision: true while the key is this
// lease's.
func (h *handle) isOurs() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)
}

func (h *handle) notHeld(why string) error {
	return fmt.Errorf("%w: etcd: %s", dlock.ErrNotHeld, why)
}

// Refresh renews the etcd lease and, alongside, reads the key to check that
// it is still this lease's and bound to that etcd lease. A longer TTL than
// the etcd lease's moves the key to a new etcd lease.
func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	sec := seconds(ttl)
	if h.moving == nil && sec > h.l.sec && time.Duration(sec)*time.Second > h.l.granted {
		return h.move(ctx, sec)
	}
	if h.l.shared && h.moving == nil {
		granted, errs := h.d.refreshShared(ctx, []*handle{h})
		return granted[0], errs[0]
	}
	granted, err := h.refreshRead(ctx)
	if err == nil && h.l.shared {
		h.d.reg.mu.Lock()
		h.until = h.l.lastSent().Add(h.l.granted)
		h.d.reg.mu.Unlock()
	}
	return granted, err
}

// refreshRead is Refresh by a renewal and a read of the key: with an etcd
// lease of its own, or with a move in doubt (it finds out where the key is
// first).
func (h *handle) refreshRead(ctx context.Context) (time.Duration, error) {
	var (
		wg   sync.WaitGroup
		kerr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		kerr = h.d.keepAlive(ctx, h.l)
	}()
	resp, err := h.d.c.Get(ctx, h.key)
	wg.Wait()
	if leaseGone(kerr) {
		return 0, h.notHeld(fmt.Sprintf("the etcd lease of %q has expired", h.key))
	}
	if err != nil {
		return 0, fmt.Errorf("etcd: reading %q: %w", h.key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
		return 0, h.notHeld(fmt.Sprintf("%q was deleted", h.key))
	}
	if bound := clientv3.LeaseID(resp.Kvs[0].Lease); bound != h.l.id {
		if h.moving == nil || bound != h.moving.id {
			return 0, h.notHeld(fmt.Sprintf("%q was rebound to another etcd lease", h.key))
		}
		// An earlier move did happen: adopt its etcd lease and renew that.
		old := h.l
		h.setLeases(h.moving, nil)
		h.d.revoke(old)
		if err := h.d.keepAlive(ctx, h.l); err != nil {
			if leaseGone(err) {
				return 0, h.notHeld(fmt.Sprintf("the etcd lease of %q has expired", h.key))
			}
			return 0, fmt.Errorf("etcd: renewing the lease of %q: %w", h.key, err)
		}
		return h.l.granted, nil
	}
	if h.moving != nil { // the move did not happen
		h.d.revoke(h.moving)
		h.setLeases(h.l, nil)
	}
	if kerr != nil {
		return 0, fmt.Errorf("etcd: renewing the lease of %q: %w", h.key, kerr)
	}
	return h.l.granted, nil
}

// move binds the key to a new etcd lease of sec seconds, longer than the
// current one's, in a transaction comparing the key's create revision. If the
// reply is lost the key may be bound to either: both outlive the current
// ValidUntil, and the next Refresh finds out which.
func (h *handle) move(ctx context.Context, sec int64) (time.Duration, error) {
	var nl *lease
	var err error
	if h.l.shared {
		nl, err = h.d.takeShared(ctx, sec)
	} else {
		nl, err = h.d.grantLease(ctx, sec)
	}
	if err != nil {
		return 0, fmt.Errorf("etcd: granting a lease for %q: %w", h.key, err)
	}
	h.setLeases(h.l, nl) // the watch may see the put before its reply
	resp, err := h.d.c.Txn(ctx).If(h.isOurs()).
		Then(clientv3.OpPut(h.key, h.value, clientv3.WithLease(nl.id))).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd: moving %q to a longer lease: %w", h.key, err)
	}
	if !resp.Succeeded {
		h.setLeases(h.l, nil)
		h.d.putLease(nl)
		return 0, h.notHeld(fmt.Sprintf("%q was deleted", h.key))
	}
	old := h.l
	h.setLeases(nl, nil)
	if nl.shared {
		h.d.reg.mu.Lock()
		h.until = nl.lastSent().Add(nl.granted)
		h.d.reg.mu.Unlock()
	}
	h.d.putLease(old) // alive, and no longer carries the key
	return nl.granted, nil
}

// Release deletes the key if it is still this lease's, and gives the etcd
// lease back to the pool.
func (h *handle) Release(ctx context.Context) error {
	if h.l.shared {
		h.d.hold(h, true)
	}
	resp, err := h.d.groupedTxn(ctx, h.key[:strings.LastIndexByte(h.key, '/')+1], h.isOurs(), []clientv3.Op{clientv3.OpDelete(h.key)}, nil)
	if h.l.shared && (err != nil || !resp.Succeeded) {
		h.d.hold(h, false)
	}
	if err != nil {
		return fmt.Errorf("etcd: releasing %q: %w", h.key, err)
	}
	if !resp.Succeeded {
		return h.notHeld(fmt.Sprintf("%q was no longer there", h.key))
	}
	if h.moving != nil {
		h.d.revoke(h.moving)
		h.setLeases(h.l, nil)
	}
	h.d.putLease(h.l)
	if h.l.shared {
		h.d.unregister(h)
	}
	return nil
}

// Held reports whether the key is still this lease's.
func (h *handle) Held(ctx context.Context) (bool, error) {
	resp, err := h.d.c.Txn(ctx).If(h.isOurs()).Commit()
	if err != nil {
		return false, fmt.Errorf("etcd: reading %q: %w", h.key, err)
	}
	return resp.Succeeded, nil
}
