package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"

	dlockdriver "github.com/dlock/dlock/driver"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TryAcquireAll takes every name of reqs or none in one transaction
// (dlockdriver.MultiAcquirer): it puts each name's key only if no key is
// under any of the names, each key on the etcd lease a TryAcquire would
// use, so that every grant is fenced by the transaction's revision, above
// every earlier grant of each name. When a name is busy the transaction's
// Else branch counts the keys under each name, and the first busy one is
// named in the *BusyError. An uncontended AcquireAll of k names then costs
// one round trip instead of k.
//
// On shared etcd leases (the default) every key goes on the Locker's one
// etcd lease of the TTL, each with a handle registered with the watch first,
// as TryAcquire does. With LeasePerLock each key gets an etcd lease of its
// own (from the idle pool, or granted, all at once): one etcd lease for all
// would break the rule that such an etcd lease is one lease's, whose expiry
// is that lease's loss, and a part released alone (a lost AcquireAll gives
// its other parts back one by one) would pool or revoke an etcd lease that
// still carries the others' keys.
//
// A transaction has a comparison, a put and a read per name; more than
// maxTxnOps names (etcd's default --max-txn-ops) decline before any I/O,
// and a server configured lower refuses the transaction before applying
// it: both send the Locker to its one-by-one path (errors.ErrUnsupported).
func (d *driver) TryAcquireAll(ctx context.Context, reqs []dlockdriver.Request) ([]*dlockdriver.Grant, error) {
	if len(reqs) > maxTxnOps {
		return nil, fmt.Errorf("etcd: one transaction for %d names, over etcd's default limit of %d operations: %w", len(reqs), maxTxnOps, errors.ErrUnsupported)
	}
	for _, req := range reqs {
		if req.Kind != dlockdriver.KindLock {
			return nil, fmt.Errorf("etcd: one transaction for several %v requests: %w", req.Kind, errors.ErrUnsupported)
		}
	}
	ks := make([]keys, len(reqs))
	cmps := make([]clientv3.Cmp, len(reqs))
	busy := make([]clientv3.Op, len(reqs))
	for i, req := range reqs {
		ks[i] = d.keys(req.Name, req.Token)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(ks[i].prefix), "=", 0).WithPrefix()
		busy[i] = clientv3.OpGet(ks[i].prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	}
	sec := seconds(reqs[0].TTL)
	for retried := false; ; retried = true {
		hs, err := d.allHandles(ctx, reqs, ks, sec)
		if err != nil {
			return nil, fmt.Errorf("etcd: acquiring %d names from %q on: %w", len(reqs), ks[0].prefix, err)
		}
		puts := make([]clientv3.Op, len(hs))
		for i, h := range hs {
			puts[i] = clientv3.OpPut(h.key, h.value, clientv3.WithLease(h.l.id))
		}
		resp, err := d.c.Txn(ctx).If(cmps...).Then(puts...).Else(busy...).Commit()
		if err != nil {
			gone := leaseGone(err)
			switch {
			case tooManyOps(err):
				// Refused before anything was applied.
				d.dropAll(hs)
				return nil, fmt.Errorf("etcd: one transaction for %d names: %w: %w", len(reqs), errors.ErrUnsupported, err)
			case !d.perLock:
				d.abandonAll(ctx, hs)
				if gone {
					d.dropShared(hs[0].l)
				}
			case gone:
				// Nothing was applied, but which etcd lease is gone is
				// not known: none goes back to the pool.
				for _, h := range hs {
					d.revoke(h.l)
				}
			default:
				// The keys may be there: the Locker's Abandon revokes
				// their etcd leases, one per request.
				d.mu.Lock()
				for i, h := range hs {
					d.attempts[reqs[i].Token] = h.l
				}
				d.mu.Unlock()
			}
			if gone && !retried {
				continue // an etcd lease was revoked behind our back
			}
			return nil, fmt.Errorf("etcd: acquiring %d names from %q on: %w", len(reqs), ks[0].prefix, err)
		}
		if !resp.Succeeded {
			d.dropAll(hs)
			for i, r := range resp.Responses {
				if r.GetResponseRange().GetCount() > 0 {
					return nil, fmt.Errorf("etcd: %q: %w", ks[i].prefix, dlockdriver.Busy(0))
				}
			}
			return nil, dlockdriver.Busy(0) // cannot be: some comparison failed
		}
		gs := make([]*dlockdriver.Grant, len(hs))
		for i, h := range hs {
			gs[i] = d.grant(h, resp.Header.Revision)
		}
		return gs, nil
	}
}

// allHandles makes the handles of TryAcquireAll's keys, each with its etcd
// lease of sec seconds: the Locker's shared one, the handles registered with
// its watch, or with LeasePerLock one each, taken at once.
func (d *driver) allHandles(ctx context.Context, reqs []dlockdriver.Request, ks []keys, sec int64) ([]*handle, error) {
	hs := make([]*handle, len(reqs))
	if !d.perLock {
		l, err := d.takeShared(ctx, sec)
		if err != nil {
			return nil, fmt.Errorf("granting a lease: %w", err)
		}
		for i, req := range reqs {
			hs[i] = &handle{d: d, key: ks[i].key, value: req.Metadata, l: l}
		}
		err = d.whileWatched(ctx, func(r *registry) {
			for _, h := range hs {
				r.keys[h.key] = h
			}
		})
		if err != nil {
			return nil, fmt.Errorf("following the changes: %w", err)
		}
		return hs, nil
	}
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l *lease
			if l, errs[i] = d.takeLease(ctx, sec); errs[i] == nil {
				hs[i] = &handle{d: d, key: ks[i].key, value: req.Metadata, l: l}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, h := range hs {
			if h != nil {
				d.putLease(h.l)
			}
		}
		return nil, fmt.Errorf("granting leases: %w", err)
	}
	return hs, nil
}

// dropAll forgets handles whose keys were not put: unregistered from the
// watch, or their etcd leases back in the pool.
func (d *driver) dropAll(hs []*handle) {
	for _, h := range hs {
		if h.l.shared {
			d.unregister(h)
		} else {
			d.putLease(h.l)
		}
	}
}

// abandonAll deletes, in one transaction, the keys of handles on a shared
// etcd lease that may have been put and will not be held, as abandon does
// one key's; it returns within cleanupGrace.
func (d *driver) abandonAll(ctx context.Context, hs []*handle) {
	d.cleanUp(ctx, func(cctx context.Context) {
		ops := make([]clientv3.Op, len(hs))
		for i, h := range hs {
			ops[i] = clientv3.OpDelete(h.key)
		}
		if _, err := d.c.Txn(cctx).Then(ops...).Commit(); err == nil {
			for _, h := range hs {
				d.unregister(h)
			}
			return
		}
		r := &d.reg
		r.mu.Lock()
		for _, h := range hs {
			h.abandoned = true // the watch loop deletes it
		}
		r.mu.Unlock()
	})
}

// tooManyOps reports whether err is the server's refusal of a transaction
// with more operations than its --max-txn-ops.
func tooManyOps(err error) bool {
	return errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrGRPCTooManyOps)
}
