package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	dlockdriver "github.com/dlock/dlock/driver"
)

// maxTxnOps is etcd's default limit of operations in one transaction
// (--max-txn-ops).
const maxTxnOps = 128

// RefreshBatch refreshes many leases (dlockdriver.BatchRefresher) as
// Refresh does each one — renew its etcd lease, read its key to check that
// it is still the lease's and bound to that etcd lease — but with every
// renewal on one keep-alive stream and the keys read by transactions of up
// to 128 reads: a handful of requests for hundreds of leases instead of two
// each. A lease whose TTL changes, or whose move to another etcd lease is
// in doubt, is refreshed alone.
func (d *driver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	granted := make([]time.Duration, len(hs))
	errs := make([]error, len(hs))
	var batch, shared []int
	for i, x := range hs {
		h, ok := x.(*handle)
		if !ok || h.moving != nil || seconds(ttls[i]) > h.l.sec && time.Duration(seconds(ttls[i]))*time.Second > h.l.granted {
			granted[i], errs[i] = x.Refresh(ctx, ttls[i])
			continue
		}
		if h.l.shared {
			shared = append(shared, i)
			continue
		}
		batch = append(batch, i)
	}
	if len(shared) > 0 {
		sh := make([]*handle, len(shared))
		for j, i := range shared {
			sh[j] = hs[i].(*handle)
		}
		g, e := d.refreshShared(ctx, sh)
		for j, i := range shared {
			granted[i], errs[i] = g[j], e[j]
		}
	}
	if len(batch) == 0 {
		return granted, errs
	}
	sent := time.Now()
	ttlLeft, kerr := d.keepAliveAll(ctx, hs, batch)
	kvs, gerr := d.readAll(ctx, hs, batch)
	for j, i := range batch {
		h := hs[i].(*handle)
		switch {
		case kerr == nil && ttlLeft[j] <= 0:
			errs[i] = h.notHeld(fmt.Sprintf("the etcd lease of %q has expired", h.key))
		case gerr != nil:
			errs[i] = fmt.Errorf("etcd: reading %q with %d other keys: %w", h.key, len(batch)-1, gerr)
		case kvs[j] == nil || kvs[j].CreateRevision != h.rev:
			errs[i] = h.notHeld(fmt.Sprintf("%q was deleted", h.key))
		case clientv3.LeaseID(kvs[j].Lease) != h.l.id:
			errs[i] = h.notHeld(fmt.Sprintf("%q was rebound to another etcd lease", h.key))
		case kerr != nil:
			errs[i] = fmt.Errorf("etcd: renewing the lease of %q with %d others: %w", h.key, len(batch)-1, kerr)
		default:
			h.l.renewed(sent)
			granted[i] = h.l.granted
		}
	}
	return granted, errs
}

// keepAliveAll renews the etcd leases of hs[batch] on one keep-alive
// stream and returns the TTL each has left (≤ 0: it no longer exists).
func (d *driver) keepAliveAll(ctx context.Context, hs []dlockdriver.Handle, batch []int) ([]int64, error) {
	conn := d.c.ActiveConnection()
	if conn == nil {
		return nil, errors.New("no connection")
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewLeaseClient(conn).LeaseKeepAlive(sctx)
	if err != nil {
		return nil, err
	}
	sendErr := make(chan error, 1)
	go func() {
		for _, i := range batch {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(hs[i].(*handle).l.id)}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	// The server answers a stream's requests in order, one each.
	left := make([]int64, len(batch))
	for j := range batch {
		resp, err := stream.Recv()
		if err != nil {
			cancel()
			<-sendErr
			return nil, err
		}
		if want := int64(hs[batch[j]].(*handle).l.id); resp.ID != want {
			cancel()
			<-sendErr
			return nil, fmt.Errorf("keep-alive answered lease %x where %x was asked", resp.ID, want)
		}
		left[j] = resp.TTL
	}
	if err := <-sendErr; err != nil {
		return nil, err
	}
	return left, nil
}

// readAll reads the keys of hs[batch] in transactions of up to maxTxnOps
// reads; a missing key's entry is nil.
func (d *driver) readAll(ctx context.Context, hs []dlockdriver.Handle, batch []int) ([]*kv, error) {
	out := make([]*kv, len(batch))
	for start := 0; start < len(batch); start += maxTxnOps {
		end := min(start+maxTxnOps, len(batch))
		ops := make([]clientv3.Op, 0, end-start)
		for _, i := range batch[start:end] {
			ops = append(ops, clientv3.OpGet(hs[i].(*handle).key))
		}
		resp, err := d.c.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, err
		}
		for j, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				out[start+j] = &kv{CreateRevision: kvs[0].CreateRevision, Lease: kvs[0].Lease}
			}
		}
	}
	return out, nil
}

// kv is what RefreshBatch needs of a key.
type kv struct {
	CreateRevision int64
	Lease          int64
}
