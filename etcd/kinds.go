package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Semaphores and read/write locks: each kind has a namespace of its own
// under the key prefix, named by a path component that no escaped lock name
// can be ("%" is always followed by "25" or "2F" in those), so that no key
// of one kind lies under another kind's prefix (see the package doc's
// Layout).
const (
	semaphoreSpace = "%semaphore/"
	rwlockSpace    = "%rwlock/"
	// markerSpace holds each Locker's marker key (shared.go).
	markerSpace = "%marker/"
)

// RWMutexName returns the prefix under which recipe.NewRWMutex
// (go.etcd.io/etcd/client/v3/experimental/recipes) uses the layout of
// dlock's read/write lock name, for the given key prefix ("" for the
// default): its keys are RWMutexName + "/read/…" and "/write/…".
func RWMutexName(keyPrefix, name string) string {
	if keyPrefix == "" {
		keyPrefix = DefaultKeyPrefix
	}
	return keyPrefix + rwlockSpace + escape(name)
}

// kindKeys are the prefix and key of a request of any kind: for a reader or
// a writer the prefix is the read/write lock's, above its "read/" and
// "write/" keys.
func (d *driver) kindKeys(req dlockdriver.Request) keys {
	var p string
	switch req.Kind {
	case dlockdriver.KindPermit:
		p = d.prefix + semaphoreSpace + escape(req.Name) + "/"
		return keys{prefix: p, key: p + req.Token}
	case dlockdriver.KindRead:
		p = d.prefix + rwlockSpace + escape(req.Name) + "/"
		return keys{prefix: p, key: p + "read/" + req.Token}
	case dlockdriver.KindWrite:
		p = d.prefix + rwlockSpace + escape(req.Name) + "/"
		return keys{prefix: p, key: p + "write/" + req.Token}
	}
	return d.keys(req.Name, req.Token)
}

// blockers is the prefix of the keys that keep a reader or a writer out
// while one of them has a lower create revision than its own: every key of
// the read/write lock for a writer, its writers' keys for a reader.
func blockers(k keys, kind dlockdriver.Kind) string {
	if kind == dlockdriver.KindRead {
		return k.prefix + "write/"
	}
	return k.prefix
}

// tryKind is TryAcquire for a permit, a reader or a writer.
func (d *driver) tryKind(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	k := d.kindKeys(req)
	for retried := false; ; retried = true {
		l, err := d.takeLease(ctx, seconds(req.TTL))
		if err != nil {
			return nil, fmt.Errorf("etcd: granting a lease for %q: %w", k.prefix, err)
		}
		var g *dlockdriver.Grant
		if req.Kind == dlockdriver.KindPermit {
			g, err = d.tryPermit(ctx, req, k, l)
		} else {
			g, err = d.tryRW(ctx, req, k, l)
		}
		switch {
		case err == nil:
			return g, nil
		case leaseGone(err) && !retried:
			continue // an idle lease was revoked behind our back
		case isRefusal(err):
			d.putLease(l)
			return nil, err
		}
		d.mu.Lock()
		d.attempts[req.Token] = l
		d.mu.Unlock()
		return nil, fmt.Errorf("etcd: acquiring %q: %w", k.prefix, err)
	}
}

// isRefusal reports an attempt that took nothing: busy, or a limit
// mismatch.
func isRefusal(err error) bool {
	var busy *dlockdriver.BusyError
	return errors.As(err, &busy) || errors.Is(err, dlock.ErrLimitMismatch)
}

// tryRW puts a writer's key if the read/write lock has no key at all, a
// reader's if it has no writer's key (held or waiting).
func (d *driver) tryRW(ctx context.Context, req dlockdriver.Request, k keys, l *lease) (*dlockdriver.Grant, error) {
	resp, err := d.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(blockers(k, req.Kind)), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(k.key, req.Metadata, clientv3.WithLease(l.id))).
		Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, dlockdriver.Busy(0)
	}
	return d.kindGrant(req.Kind, k, resp.Header.Revision, req.Metadata, l), nil
}

// kindGrant is grant for any kind: readers carry no fencing token.
func (d *driver) kindGrant(kind dlockdriver.Kind, k keys, rev int64, value string, l *lease) *dlockdriver.Grant {
	g := d.grant(&handle{d: d, key: k.key, value: value, l: l}, rev)
	if kind == dlockdriver.KindRead {
		g.Fence = 0
	}
	return g
}

// tryPermit puts a permit's key if fewer than Limit keys are under the
// semaphore and they all carry the same limit: one transaction on an empty
// semaphore; otherwise a read, then a transaction that puts the key only if
// no key was created since the read (deletions only free permits).
func (d *driver) tryPermit(ctx context.Context, req dlockdriver.Request, k keys, l *lease) (*dlockdriver.Grant, error) {
	val := strconv.Itoa(req.Limit)
	put := clientv3.OpPut(k.key, val, clientv3.WithLease(l.id))
	empty := clientv3.Compare(clientv3.CreateRevision(k.prefix), "=", 0).WithPrefix()
	for {
		resp, err := d.c.Txn(ctx).If(empty).Then(put).
			Else(clientv3.OpGet(k.prefix, clientv3.WithPrefix(), clientv3.WithLimit(1))).
			Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return d.grant(&handle{d: d, key: k.key, value: val, l: l}, resp.Header.Revision), nil
		}
		rr := resp.Responses[0].GetResponseRange()
		if len(rr.Kvs) == 0 {
			continue // cannot be: the prefix was not empty
		}
		if held := string(rr.Kvs[0].Value); held != val {
			return nil, limitMismatch(req, held)
		}
		if rr.Count >= int64(req.Limit) {
			return nil, dlockdriver.Busy(0)
		}
		resp, err = d.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k.prefix), "<", resp.Header.Revision+1).WithPrefix()).
			Then(put).
			Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return d.grant(&handle{d: d, key: k.key, value: val, l: l}, resp.Header.Revision), nil
		}
		// A key was created since the read: look again.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// limitMismatch is the error for a permit asked under req.Limit while the
// semaphore's keys carry held.
func limitMismatch(req dlockdriver.Request, held string) error {
	n, _ := strconv.Atoi(held)
	return dlockdriver.LimitMismatch(req.Name, req.Limit, n)
}

// acquireKind is Acquire for a permit, a reader or a writer: it puts the
// waiter's key, reading in the same transaction what it needs to know
// whether it holds and, if not, what to wait for.
func (d *driver) acquireKind(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	k := d.kindKeys(req)
	value := req.Metadata
	if req.Kind == dlockdriver.KindPermit {
		value = strconv.Itoa(req.Limit)
	}
	var (
		l    *lease
		resp *clientv3.TxnResponse
		err  error
	)
	for retried := false; ; retried = true {
		l, err = d.takeLease(ctx, seconds(req.TTL))
		if err != nil {
			return nil, d.waitError(ctx, k, fmt.Errorf("granting a lease: %w", err))
		}
		put := clientv3.OpPut(k.key, value, clientv3.WithLease(l.id))
		if req.Kind == dlockdriver.KindPermit {
			resp, err = d.c.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(k.prefix), "=", 0).WithPrefix()).
				Then(put).
				// Not empty: queue up if every key carries our limit, and
				// count the keys (ours is the newest); else read a holder's
				// limit for the error.
				Else(clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k.prefix), "=", value).WithPrefix()},
					[]clientv3.Op{put, clientv3.OpGet(k.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())},
					[]clientv3.Op{clientv3.OpGet(k.prefix, clientv3.WithPrefix(), clientv3.WithLimit(1))},
				)).Commit()
		} else {
			b := blockers(k, req.Kind)
			resp, err = d.c.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(b), "=", 0).WithPrefix()).
				Then(put).
				// Blocked: queue up, and read the newest two blockers (a
				// writer's own key is among them) and the first.
				Else(put,
					clientv3.OpGet(b, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
						clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2)),
					clientv3.OpGet(b, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...),
				).Commit()
		}
		if err == nil {
			break
		}
		if leaseGone(err) && !retried {
			continue // an idle lease was revoked behind our back
		}
		// The key may be there: revoking the lease removes it.
		d.revokeAfter(ctx, l)
		return nil, d.waitError(ctx, k, err)
	}
	w := &waiter{d: d, k: k, rev: resp.Header.Revision, l: l, value: value, seen: resp.Header.Revision,
		kind: req.Kind, blockers: blockers(k, req.Kind), limit: req.Limit}
	if resp.Succeeded {
		return w.grant(), nil
	}
	if req.Kind == dlockdriver.KindPermit {
		inner := resp.Responses[0].GetResponseTxn()
		if !inner.Succeeded {
			d.putLease(l)
			var held string
			if kvs := inner.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				held = string(kvs[0].Value)
			}
			return nil, limitMismatch(req, held)
		}
		w.ahead = int(inner.Responses[1].GetResponseRange().GetCount()) - 1
		if w.ahead < w.limit {
			return w.grant(), nil
		}
	} else {
		newest := resp.Responses[1].GetResponseRange().GetKvs()
		first := resp.Responses[2].GetResponseRange().GetKvs()
		if len(first) == 0 || first[0].CreateRevision >= w.rev {
			return w.grant(), nil
		}
		for _, kv := range newest {
			if kv.CreateRevision < w.rev {
				w.pred, w.predIsFirst = string(kv.Key), kv.CreateRevision == first[0].CreateRevision
				break
			}
		}
		if w.pred == "" {
			w.leave(ctx)
			return nil, fmt.Errorf("%w: etcd: the queue of %q changed under the waiter's own put (its lease expired?)", dlock.ErrNotAcquired, k.prefix)
		}
	}
	g, err := w.wait(ctx)
	if err != nil {
		w.leave(ctx)
		return nil, d.waitError(ctx, k, err)
	}
	return g, nil
}

// watchPermits waits until fewer than limit keys are older than the
// waiter's: it watches the deletions under the semaphore from the revision
// after its last read, and counts those of older keys (keys ahead go away in
// any order; none older can appear). It returns free=false, err=nil when
// the watch ended otherwise (a compaction, a lost leader, a reconnection):
// the semaphore must be read again.
func (w *waiter) watchPermits(ctx context.Context, gone <-chan error) (free bool, err error) {
	if beforeWatch != nil {
		beforeWatch(w.k.prefix)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wc := w.d.c.Watch(wctx, w.k.prefix, clientv3.WithPrefix(), clientv3.WithRev(w.seen+1),
		clientv3.WithPrevKV(), clientv3.WithFilterPut())
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
			for _, ev := range wr.Events {
				if ev.Type != mvccpb.DELETE {
					continue
				}
				if string(ev.Kv.Key) == w.k.key {
					return false, errWaiterExpired
				}
				if ev.PrevKv == nil {
					return false, nil // cannot tell its age: read again
				}
				if ev.PrevKv.CreateRevision < w.rev {
					w.ahead--
				}
				w.seen = ev.Kv.ModRevision
			}
			if w.ahead < w.limit {
				return true, nil
			}
		}
	}
}

// queryPermits reads the semaphore again: how many keys are older than the
// waiter's, and whether that leaves it among the first limit. It fails
// with errWaiterExpired when the waiter's key is gone.
func (w *waiter) queryPermits(ctx context.Context) (first bool, err error) {
	// Count is that of the whole range: the older keys are counted by
	// listing them.
	resp, err := w.d.c.Txn(ctx).Then(
		clientv3.OpGet(w.k.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(w.rev-1)),
		clientv3.OpGet(w.k.key, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return false, err
	}
	if resp.Responses[1].GetResponseRange().GetCount() == 0 {
		return false, errWaiterExpired
	}
	w.ahead = len(resp.Responses[0].GetResponseRange().GetKvs())
	w.seen = resp.Header.Revision
	return w.ahead < w.limit, nil
}
