package etcd

import (
	"context"
	"errors"
	"strings"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The wait of a lock's waiter on a shared etcd lease follows the Locker's
// watch (shared.go), which already delivers every change under the prefix:
// the waiter reads, in the transaction that puts its key, every key under
// the name (each older than its own: nothing else is there at that
// revision), and holds once the watch has delivered the deletion of each of
// them. Keys older than its own only go away (a new key is always newer),
// so the set only shrinks, whatever deletes its keys (releases, expiries,
// cancelled waits) and in whatever order. A waiter needs no watch of its
// own, no read when its predecessor goes, and it is granted on the event of
// the last older key's deletion. When the Locker's watch lost revisions to
// a compaction the set is read again (linearizably) and the events after
// that read applied. The read is of keys only, and of at most maxFollowed
// of them (a predecessor's watch cost a watch and, behind a waiter, a read
// per hand-off; behind more than maxFollowed keys a waiter still waits so).

// maxFollowed bounds the keys a waiter follows: one that finds more ahead
// of it (a long queue, or keys nested under the name) watches its
// predecessor's key instead, and reads the queue again each time that goes
// (see waiter.wait), so that joining a queue of n costs at most
// maxFollowed+1 keys in the reply, and a Locker's waiters hold at most that
// many keys each.
const maxFollowed = 64

// errWaiterKeyGone reports that a waiter's key was deleted while it waited
// (by hand, or with its etcd lease): it is not granted.
var errWaiterKeyGone = errors.New("etcd: the waiter's key was deleted while it waited")

// queueWait is one waiter's view of the keys older than its own; under
// d.reg.mu.
type queueWait struct {
	key string // its own key
	rev int64  // its key's create revision; 0 until its put is known
	// older holds the keys older than its own not yet seen deleted, as of
	// asOf: events at or before asOf are reflected in it.
	older map[string]bool
	asOf  int64
	// stale: the Locker's watch lost events (a compaction): older must be
	// read again. Events that arrive while rev is 0 or older is stale wait
	// in pending.
	stale   bool
	epoch   int // counts the times older went stale
	pending []*clientv3.Event
	lost    bool          // its own key was deleted
	wake    chan struct{} // buffered: something changed
}

func (q *queueWait) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// event applies one event under the waiter's name; r.mu held.
func (q *queueWait) event(ev *clientv3.Event) {
	if q.rev == 0 || q.stale {
		q.pending = append(q.pending, ev)
		return
	}
	if ev.Kv.ModRevision <= q.asOf || ev.Type != mvccpb.DELETE {
		return
	}
	k := string(ev.Kv.Key)
	switch {
	case k == q.key:
		q.lost = true
		q.signal()
	case q.older[k]:
		delete(q.older, k)
		if len(q.older) == 0 {
			q.signal()
		}
	}
}

// reset installs the keys older than the waiter's as of revision asOf, read
// in the given epoch, and applies the events held meanwhile; r.mu held. A
// read from before the last loss of events is dropped: it is read again.
func (q *queueWait) reset(older map[string]bool, asOf int64, epoch int) {
	if epoch != q.epoch {
		return
	}
	q.older, q.asOf, q.stale = older, asOf, false
	pending := q.pending
	q.pending = nil
	for _, ev := range pending {
		q.event(ev)
	}
	q.signal()
}

// addWait registers a waiter on the queue prefix before its put: every
// event after the put reaches it. It starts the watch again if it stopped
// for idleness; ctx bounds that.
func (d *driver) addWait(ctx context.Context, prefix, key string) (*queueWait, error) {
	q := &queueWait{key: key, wake: make(chan struct{}, 1)}
	err := d.whileWatched(ctx, func(r *registry) {
		if r.waits == nil {
			r.waits = make(map[string][]*queueWait)
		}
		r.waits[prefix] = append(r.waits[prefix], q)
	})
	if err != nil {
		return nil, err
	}
	return q, nil
}

// dropWait unregisters a waiter.
func (d *driver) dropWait(prefix string, q *queueWait) {
	r := &d.reg
	r.mu.Lock()
	ws := r.waits[prefix]
	for i, x := range ws {
		if x == q {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(r.waits, prefix)
	} else {
		r.waits[prefix] = ws
	}
	r.mu.Unlock()
}

// waitsEvent hands an event to the waiters of every queue whose prefix the
// key is under (a key nested deeper, not dlock's, blocks the lock as the
// queue's transactions see it); r.mu held.
func (r *registry) waitsEvent(ev *clientv3.Event) {
	if len(r.waits) == 0 {
		return
	}
	k := string(ev.Kv.Key)
	for i := strings.IndexByte(k, '/'); i >= 0; {
		for _, q := range r.waits[k[:i+1]] {
			q.event(ev)
		}
		j := strings.IndexByte(k[i+1:], '/')
		if j < 0 {
			break
		}
		i += j + 1
	}
}

// waitsStale marks every waiter's set stale after the watch lost revisions;
// r.mu held.
func (r *registry) waitsStale() {
	for _, ws := range r.waits {
		for _, q := range ws {
			q.stale = true
			q.epoch++
			q.signal()
		}
	}
}

// settleWait records the waiter's put at revision rev and the keys that
// were under its name then (its own among them).
func (d *driver) settleWait(q *queueWait, rev int64, kvs []*mvccpb.KeyValue) {
	older := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		if kv.CreateRevision < rev {
			older[string(kv.Key)] = true
		}
	}
	r := &d.reg
	r.mu.Lock()
	q.rev = rev
	if !q.stale { // else it is read again
		q.reset(older, rev, q.epoch)
	}
	r.mu.Unlock()
}

// waitShared waits until no key older than the waiter's is left, its ctx
// ends, its key is found gone, or its etcd lease is found gone, keeping the
// etcd lease alive meanwhile.
func (w *waiter) waitShared(ctx context.Context, q *queueWait) (*dlockdriver.Grant, error) {
	gone, stop := w.keepAliveWhile(ctx)
	defer stop()
	r := &w.d.reg
	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	for {
		r.mu.Lock()
		lost, stale, free := q.lost, q.stale, len(q.older) == 0
		r.mu.Unlock()
		switch {
		case lost:
			return nil, errWaiterKeyGone
		case stale:
			err := w.reread(ctx, q)
			if err == nil {
				retry.Reset()
				continue
			}
			if ctx.Err() != nil || errors.Is(err, errWaiterExpired) || errors.Is(err, errWaiterKeyGone) {
				return nil, err
			}
			t := time.NewTimer(retry.Next())
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case err := <-gone:
				t.Stop()
				return nil, err
			case <-t.C:
			}
			continue
		case free:
			return w.confirm(ctx)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-gone:
			return nil, err
		case <-q.wake:
		}
	}
}

// reread reads the keys older than the waiter's again, linearizably, after
// the Locker's watch lost revisions.
func (w *waiter) reread(ctx context.Context, q *queueWait) error {
	r := &w.d.reg
	r.mu.Lock()
	epoch := q.epoch
	r.mu.Unlock()
	resp, err := w.d.c.Txn(ctx).Then(
		clientv3.OpGet(w.k.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(w.rev-1)),
		clientv3.OpGet(w.k.key, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return err
	}
	if resp.Responses[1].GetResponseRange().GetCount() == 0 {
		return errWaiterKeyGone
	}
	older := make(map[string]bool)
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		older[string(kv.Key)] = true
	}
	r.mu.Lock()
	q.reset(older, resp.Header.Revision, epoch)
	r.mu.Unlock()
	return nil
}
