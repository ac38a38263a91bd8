package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retry delays of a waiter after a backend error (a lost leader, a broken
// connection): jittered, doubling from retryMin up to retryMax.
const (
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// cleanupTimeout bounds the deletion of a waiter's key when its wait ends
// without a grant; if it fails the key goes with its etcd lease, which is no
// longer renewed and is revoked in the background.
const cleanupTimeout = time.Second

// cleanupGrace is how long a call whose ctx has ended waits for its
// clean-up before it returns and leaves the clean-up to finish in the
// background (bounded by cleanupTimeout; Close waits for it): the caller's
// ctx bounds the call, a hung server's silence must not.
const cleanupGrace = 250 * time.Millisecond

// cleanUp runs f, the clean-up after a call that ended without a grant,
// with cleanupTimeout, and waits for it at most cleanupGrace.
func (d *driver) cleanUp(ctx context.Context, f func(context.Context)) {
	done := make(chan struct{})
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer close(done)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		f(cctx)
	}()
	t := time.NewTimer(cleanupGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// revokeAfter revokes l, whose key may be there, after a failed put.
func (d *driver) revokeAfter(ctx context.Context, l *lease) {
	d.cleanUp(ctx, func(cctx context.Context) { _, _ = d.c.Revoke(cctx, l.id) })
}

// Test hooks, nil outside tests.
var (
	// beforeWatch runs between the read that found a waiter's predecessor
	// and the watch on it (for a permit's waiter: on the semaphore's
	// prefix; for a lock's waiter on a shared etcd lease, which has no
	// watch of its own: before its wait takes the read into account, with
	// its own key).
	beforeWatch func(pred string)
	// watchEnded runs when a waiter's watch ends without the deletion it
	// waits for (compaction, lost leader, closed stream), and when the
	// Locker's watch ends on a compaction.
	watchEnded func(wr clientv3.WatchResponse)
)

// errWaiterExpired reports that a waiter's etcd lease expired while it
// waited: it is not granted.
var errWaiterExpired = errors.New("etcd: the waiter's etcd lease expired while it waited (its connection was down for longer than its TTL?)")

// waiter is one Acquire in progress, with its key in the queue.
type waiter struct {
	d     *driver
	k     keys
	rev   int64 // the create revision of its key
	l     *lease
	value string
	// h is the handle a lock's waiter on a shared etcd lease registered
	// before its put (nil otherwise): its grant.
	h *handle

	kind dlockdriver.Kind
	// blockers is the prefix of the keys that keep it waiting while one of
	// them has a lower create revision than its own: the lock's queue, or
	// see blockers (kinds.go). Unused for a permit.
	blockers string

	// What the last read said: the predecessor's key, whether it was the
	// holder then, and the revision of the read.
	pred        string
	predIsFirst bool
	seen        int64

	// A permit's waiter: the semaphore's limit and how many keys have a
	// lower create revision than its own, as of seen and the deletions
	// watched since.
	limit, ahead int
}

// Acquire puts the waiter's key and, when the name is taken, reads its
// predecessor in the same transaction, then waits for its predecessors to
// go (see the package doc).
func (d *driver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	if req.Kind != dlockdriver.KindLock {
		return d.acquireKind(ctx, req)
	}
	k := d.keys(req.Name, req.Token)
	keysOnly := clientv3.WithKeysOnly()
	var (
		l    *lease
		h    *handle
		q    *queueWait // the wait of a waiter on a shared etcd lease
		resp *clientv3.TxnResponse
		err  error
	)
	if !d.perLock {
		if q, err = d.addWait(ctx, k.prefix, k.key); err != nil {
			return nil, d.waitError(ctx, k, fmt.Errorf("following the changes: %w", err))
		}
		defer d.dropWait(k.prefix, q)
	}
	for retried := false; ; retried = true {
		l, err = d.lockLease(ctx, seconds(req.TTL))
		if err != nil {
			return nil, d.waitError(ctx, k, fmt.Errorf("granting a lease: %w", err))
		}
		h = nil
		if l.shared {
			h = &handle{d: d, key: k.key, value: req.Metadata, l: l}
			if err := d.register(ctx, h); err != nil {
				return nil, d.waitError(ctx, k, fmt.Errorf("following the changes: %w", err))
			}
		}
		put := clientv3.OpPut(k.key, req.Metadata, clientv3.WithLease(l.id))
		// Taken: queue up, and read the newest two (ours and our
		// predecessor) and the first; on a shared etcd lease, every key
		// (see queuewait.go).
		taken := []clientv3.Op{put,
			clientv3.OpGet(k.prefix, clientv3.WithPrefix(), keysOnly,
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2)),
			clientv3.OpGet(k.prefix, append(clientv3.WithFirstCreate(), keysOnly)...),
		}
		if l.shared {
			// The newest maxFollowed+1 (its own and the ones just ahead):
			// behind more, it watches its predecessor instead.
			taken = []clientv3.Op{put, clientv3.OpGet(k.prefix, clientv3.WithPrefix(), keysOnly,
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(maxFollowed+1))}
		}
		resp, err = d.groupedTxn(ctx, k.prefix,
			// Free: just put, as TryAcquire does.
			clientv3.Compare(clientv3.CreateRevision(k.prefix), "=", 0).WithPrefix(),
			[]clientv3.Op{put}, taken)
		if err == nil {
			break
		}
		if h != nil {
			// The key may be there: delete it (the etcd lease is others' too).
			d.abandon(ctx, h)
			if leaseGone(err) {
				d.dropShared(l)
			}
			if leaseGone(err) && !retried {
				continue
			}
			return nil, d.waitError(ctx, k, err)
		}
		if leaseGone(err) && !retried {
			continue // an idle lease was revoked behind our back
		}
		// The key may be there: revoking the lease removes it.
		d.revokeAfter(ctx, l)
		return nil, d.waitError(ctx, k, err)
	}
	w := &waiter{d: d, k: k, rev: resp.Header.Revision, l: l, value: req.Metadata, seen: resp.Header.Revision, blockers: k.prefix, h: h}
	if h != nil {
		d.settle(h, w.rev, true)
	}
	if resp.Succeeded {
		return w.grant(), nil
	}
	if h != nil {
		rr := resp.Responses[1].GetResponseRange()
		kvs := rr.GetKvs()
		if !slices.ContainsFunc(kvs, func(kv *mvccpb.KeyValue) bool { return kv.CreateRevision == w.rev && string(kv.Key) == k.key }) {
			w.leave(ctx)
			return nil, fmt.Errorf("%w: etcd: the queue of %q changed under the waiter's own put (its lease expired?)", dlock.ErrNotAcquired, k.prefix)
		}
		if rr.GetMore() {
			// More than maxFollowed ahead: wait on the predecessor (never
			// the first, with so many ahead).
			d.dropWait(k.prefix, q)
			w.pred = string(kvs[1].Key)
			g, err := w.wait(ctx)
			if err != nil {
				w.leave(ctx)
				return nil, d.waitError(ctx, k, err)
			}
			return g, nil
		}
		if beforeWatch != nil {
			beforeWatch(k.key)
		}
		d.settleWait(q, w.rev, kvs)
		g, err := w.waitShared(ctx, q)
		if err != nil {
			w.leave(ctx)
			return nil, d.waitError(ctx, k, err)
		}
		return g, nil
	}
	first := resp.Responses[2].GetResponseRange().GetKvs()
	if len(first) > 0 && first[0].CreateRevision == w.rev {
		return w.grant(), nil
	}
	newest := resp.Responses[1].GetResponseRange().GetKvs()
	if len(first) == 0 || len(newest) < 2 || newest[0].CreateRevision != w.rev {
		w.leave(ctx)
		return nil, fmt.Errorf("%w: etcd: the queue of %q changed under the waiter's own put (its lease expired?)", dlock.ErrNotAcquired, k.prefix)
	}
	w.pred, w.predIsFirst = string(newest[1].Key), newest[1].CreateRevision == first[0].CreateRevision
	g, err := w.wait(ctx)
	if err != nil {
		w.leave(ctx)
		return nil, d.waitError(ctx, k, err)
	}
	return g, nil
}

func (d *driver) waitError(ctx context.Context, k keys, err error) error {
	if ctx.Err() != nil {
		return errors.Join(dlock.ErrNotAcquired, ctx.Err())
	}
	if errors.Is(err, dlock.ErrNotAcquired) {
		return err
	}
	return fmt.Errorf("%w: etcd: waiting for %q: %w", dlock.ErrNotAcquired, k.prefix, err)
}

func (w *waiter) grant() *dlockdriver.Grant {
	if w.h != nil {
		return w.d.grant(w.h, w.rev)
	}
	return w.d.kindGrant(w.kind, w.k, w.rev, w.value, w.l)
}

// leave deletes the waiter's key, if it is still there, after a wait that
// ended without a grant, and gives its etcd lease back to the pool; when it
// cannot, it revokes the etcd lease in the background. It returns within
// cleanupGrace (see cleanUp).
func (w *waiter) leave(ctx context.Context) {
	w.d.cleanUp(ctx, w.leaveNow)
}

func (w *waiter) leaveNow(cctx context.Context) {
	resp, err := w.d.c.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.k.key), "=", w.rev)).
		Then(clientv3.OpDelete(w.k.key)).
		Commit()
	switch {
	case err != nil && w.h != nil:
		w.d.abandonNow(cctx, w.h)
	case err != nil:
		w.d.revoke(w.l)
	case w.h != nil:
		w.d.unregister(w.h)
	case resp.Succeeded:
		w.d.putLease(w.l)
	default: // gone with its etcd lease
	}
}

// keepAliveWhile keeps the waiter's etcd lease alive (keepAlive) until stop
// returns or ctx ends; gone reports the etcd lease found gone.
func (w *waiter) keepAliveWhile(ctx context.Context) (gone <-chan error, stop func()) {
	kctx, cancel := context.WithCancel(ctx)
	g := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.keepAlive(kctx, g)
	}()
	return g, func() {
		cancel()
		wg.Wait()
	}
}

// wait blocks until the waiter's key is the first under its prefix, its ctx
// ends, or its etcd lease is found gone, keeping the etcd lease alive
// meanwhile.
func (w *waiter) wait(ctx context.Context) (*dlockdriver.Grant, error) {
	gone, stop := w.keepAliveWhile(ctx)
	defer stop()

	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	// pause waits out a backend error (a lost leader, a broken connection)
	// before the next read, unless ctx ends or the etcd lease is found gone.
	pause := func(err error) error {
		if ctx.Err() != nil || errors.Is(err, errWaiterExpired) {
			return err
		}
		t := time.NewTimer(retry.Next())
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-gone:
			return err
		case <-t.C:
			return nil
		}
	}
	watch := true // false: read the queue again first
	for {
		if watch {
			var free bool
			var err error
			if w.kind == dlockdriver.KindPermit {
				free, err = w.watchPermits(ctx, gone)
			} else {
				var deleted bool
				deleted, err = w.watch(ctx, gone)
				// The last blocker's key is gone and none older than ours
				// can appear.
				free = deleted && w.predIsFirst
			}
			if err != nil {
				if err := pause(err); err != nil {
					return nil, err
				}
				watch = false
				continue
			}
			if free && time.Now().Before(w.l.validUntil()) {
				// Ours holds, and is alive.
				return w.grant(), nil
			}
		}
		var first bool
		var err error
		if w.kind == dlockdriver.KindPermit {
			first, err = w.queryPermits(ctx)
		} else {
			first, err = w.query(ctx)
		}
		if err == nil && !first {
			retry.Reset()
			watch = true
			continue
		}
		if err == nil {
			var g *dlockdriver.Grant
			if g, err = w.confirm(ctx); err == nil {
				return g, nil
			}
		}
		if err := pause(err); err != nil {
			return nil, err
		}
		watch = false
	}
}

// confirm grants a waiter found first, renewing its etcd lease first when
// its life can no longer be vouched for.
func (w *waiter) confirm(ctx context.Context) (*dlockdriver.Grant, error) {
	if time.Since(w.l.lastSent()) >= w.l.granted/3 {
		if err := w.d.keepAlive(ctx, w.l); err != nil {
			if leaseGone(err) {
				return nil, errWaiterExpired
			}
			if time.Now().After(w.l.validUntil()) {
				return nil, err
			}
		}
	}
	return w.grant(), nil
}

// watch waits for the deletion of w.pred, watched from now on: once the
// watch is in place it checks that the key was not deleted since w.seen.
// It returns deleted=false, err=nil when the watch ended otherwise (a
// compaction, a lost leader, a reconnection): the queue must be read again.
func (w *waiter) watch(ctx context.Context, gone <-chan error) (deleted bool, err error) {
	if beforeWatch != nil {
		beforeWatch(w.pred)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wc := w.d.c.Watch(wctx, w.pred, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case err := <-gone:
			return false, err
		case wr, ok := <-wc:
			if !ok || wr.Canceled || wr.Err() != nil {
				if watchEnded != nil {
					watchEnded(wr)
				}
				return false, nil
			}
			if wr.Created {
				if wr.Header.Revision <= w.seen {
					continue
				}
				// Revisions went by between the read and the watch: was
				// the predecessor deleted meanwhile?
				resp, err := w.d.c.Get(ctx, w.pred, clientv3.WithCountOnly())
				if err != nil {
					return false, err
				}
				if resp.Count == 0 {
					return true, nil
				}
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return true, nil
				}
			}
		}
	}
}

// query reads the queue again: whether the waiter's key is first (no
// blocker is older), and otherwise its predecessor now (the newest blocker
// older than it). It fails with errWaiterExpired when the waiter's key is
// gone.
func (w *waiter) query(ctx context.Context) (first bool, err error) {
	keysOnly := clientv3.WithKeysOnly()
	resp, err := w.d.c.Txn(ctx).Then(
		clientv3.OpGet(w.blockers, append(clientv3.WithFirstCreate(), keysOnly)...),
		clientv3.OpGet(w.blockers, append(clientv3.WithLastCreate(), keysOnly, clientv3.WithMaxCreateRev(w.rev-1))...),
		clientv3.OpGet(w.k.key, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return false, err
	}
	if resp.Responses[2].GetResponseRange().GetCount() == 0 {
		return false, errWaiterExpired
	}
	firstKV := resp.Responses[0].GetResponseRange().GetKvs()
	if len(firstKV) == 0 || firstKV[0].CreateRevision >= w.rev {
		return true, nil
	}
	pred := resp.Responses[1].GetResponseRange().GetKvs()
	if len(pred) == 0 { // cannot be: the first one is older than ours
		return false, fmt.Errorf("etcd: inconsistent read of %q", w.k.prefix)
	}
	w.pred = string(pred[0].Key)
	w.predIsFirst = pred[0].CreateRevision == firstKV[0].CreateRevision
	w.seen = resp.Header.Revision
	return false, nil
}

// keepAlive renews the waiter's etcd lease every third of its TTL until ctx
// ends, retrying failures with backoff; it reports on gone, and returns, when
// the server says the etcd lease no longer exists.
func (w *waiter) keepAlive(ctx context.Context, gone chan<- error) {
	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	t := time.NewTimer(time.Until(w.l.lastSent().Add(w.l.granted / 3)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := w.d.keepAlive(ctx, w.l)
		switch {
		case err == nil:
			retry.Reset()
			t.Reset(time.Until(w.l.lastSent().Add(w.l.granted / 3)))
		case leaseGone(err):
			gone <- errWaiterExpired
			return
		default:
			t.Reset(retry.Next())
		}
	}
}
