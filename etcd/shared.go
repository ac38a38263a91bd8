// One file, over 600 lines: the shared etcd lease per TTL class and the one
// watch per Locker that tells each lock's deletion apart are one mechanism:
// the watch loop settles, judges and reaps the handles on the shared leases.

package etcd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Shared etcd leases: the locks of a Locker with the same TTL in seconds
// bind their keys to one etcd lease (as concurrency.Session does), so that
// an acquisition needs no grant, a release no revocation, and a refresh of
// any number of them one renewal per TTL. What a lease of its own told each
// lock is told instead by one watch per Locker on the key prefix: a key
// deleted, re-created or rebound behind its lease's back ends that lease
// alone (at once, through OnLost), and a refresh waits until the watch has
// delivered every change up to a linearizable read made after the renewal
// was sent (see caughtUp), so that it never vouches for a key the watch has
// not seen through. The
// shared etcd lease's expiry deletes all its keys: every lease on it is
// lost, and each reports it. A lock that is not refreshed would outlive its
// TTL on an etcd lease its neighbours keep alive: the watch loop deletes its
// key once its own TTL has run out (reapEvery), as etcd would have.

// reapEvery is how often the watch loop looks for locks whose own TTL has
// run out without a refresh, and for abandoned keys to delete.
const reapEvery = 250 * time.Millisecond

// watchRetry bounds the pause before a broken Locker watch is set up again.
const watchRetry = time.Second

// idleWatch is how long the watch runs on after the Locker last had a lock
// or a waiter on a shared etcd lease. It then stops, so that an idle Locker
// is sent nothing and costs the server nothing per operation of the others
// (every put and delete under the prefix went to every Locker's watch); the
// next registration starts it again, at the price of one revision read.
// An attempt's put applied after its abandonment, while the watch is
// stopped, is not deleted at once: it goes with its etcd lease, within the
// TTL, as with a lease per lock.
var idleWatch atomic.Int64

func init() { idleWatch.Store(int64(10 * time.Second)) }

// registry is the state of a Locker's shared etcd leases and of its watch.
type registry struct {
	mu     sync.Mutex
	keys   map[string]*handle // the locks on shared etcd leases, by key
	ids    map[clientv3.LeaseID]bool
	shared map[int64]*lease // the current shared etcd lease by TTL in seconds
	rev    int64            // every event up to rev has been applied
	marker string           // the Locker's marker key: P %marker/<random id>
	moved  chan struct{}    // closed (and replaced) when rev advances
	// waits are the lock waiters on shared etcd leases by queue prefix
	// (queuewait.go).
	waits map[string][]*queueWait

	start  sync.Mutex // serialises startWatch and stopWatch
	cancel context.CancelFunc
	done   chan struct{}
	// running is true from startWatch until the watch loop stops itself
	// for idleness (or is stopped); a key or a waiter is only registered
	// while it is true, under mu. busy is when the Locker last had one.
	running bool
	busy    time.Time

	renew sync.Mutex // serialises renewals of a shared lease by takeShared
}

// watchCtx tags ctx so that the Locker's watch has a gRPC stream of its own
// and ends when its member loses the leader.
func watchCtx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "dlock-watch", "locker")
}

// startWatch starts the Locker's watch on the prefix, from the revision of a
// linearizable read: every key put afterwards is seen. It does nothing
// while the watch runs.
func (d *driver) startWatch(ctx context.Context) error {
	r := &d.reg
	r.start.Lock()
	defer r.start.Unlock()
	r.mu.Lock()
	running := r.running
	r.mu.Unlock()
	if running {
		return nil
	}
	if r.done != nil {
		<-r.done // a loop that stopped for idleness is ending
	}
	resp, err := d.c.Get(ctx, d.prefix, clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("the Locker is closed")
	}
	r.mu.Lock()
	r.rev = max(r.rev, resp.Header.Revision)
	r.running, r.busy = true, time.Now()
	r.mu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go d.watchLoop(wctx, r.done)
	return nil
}

// stopWatch ends the watch loop and waits for it.
func (d *driver) stopWatch() {
	r := &d.reg
	r.start.Lock()
	defer r.start.Unlock()
	if r.done == nil {
		return
	}
	r.cancel()
	<-r.done
	r.mu.Lock()
	r.running = false
	r.mu.Unlock()
}

// takeShared returns the shared etcd lease of sec seconds, with at least
// two thirds of its TTL left, granting one when there is none (or it has
// expired).
func (d *driver) takeShared(ctx context.Context, sec int64) (*lease, error) {
	if err := d.startWatch(ctx); err != nil {
		return nil, err
	}
	r := &d.reg
	r.renew.Lock()
	defer r.renew.Unlock()
	r.mu.Lock()
	l := r.shared[sec]
	r.mu.Unlock()
	if l != nil {
		age := time.Since(l.lastSent())
		if age < l.granted/3 {
			return l, nil
		}
		if age < l.granted*2/3 {
			err := d.keepAlive(ctx, l)
			if err == nil {
				return l, nil
			}
			if !leaseGone(err) {
				return nil, err
			}
		}
		d.dropShared(l)
	}
	l, err := d.grantLease(ctx, sec)
	if err != nil {
		return nil, err
	}
	l.shared = true
	r.mu.Lock()
	r.shared[sec] = l
	r.ids[l.id] = true
	r.mu.Unlock()
	return l, nil
}

// dropShared forgets a shared etcd lease found gone (or about to be), so
// that the next acquisition grants a new one.
func (d *driver) dropShared(l *lease) {
	r := &d.reg
	r.mu.Lock()
	if r.shared[l.sec] == l {
		delete(r.shared, l.sec)
	}
	r.mu.Unlock()
}

// register records a lock's handle before its key is put: events on the
// key are kept until settle knows its create revision. It starts the watch
// again if it stopped for idleness; ctx bounds that.
func (d *driver) register(ctx context.Context, h *handle) error {
	return d.whileWatched(ctx, func(r *registry) { r.keys[h.key] = h })
}

// whileWatched calls add under r.mu while the watch runs, starting it when
// it does not; ctx bounds the start.
func (d *driver) whileWatched(ctx context.Context, add func(*registry)) error {
	r := &d.reg
	for {
		r.mu.Lock()
		if r.running {
			add(r)
			r.busy = time.Now()
			r.mu.Unlock()
			return nil
		}
		r.mu.Unlock()
		if err := d.startWatch(ctx); err != nil {
			return err
		}
	}
}

// idle stops the watch for good when the Locker has had no lock or waiter
// on a shared etcd lease for idleWatch, and reports whether it did; the
// watch loop calls it.
func (d *driver) idle(now time.Time) bool {
	r := &d.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) > 0 || len(r.waits) > 0 {
		r.busy = now
		return false
	}
	if now.Sub(r.busy) < time.Duration(idleWatch.Load()) {
		return false
	}
	r.running = false
	return true
}

// unregister forgets a handle whose key is gone or was never put.
func (d *driver) unregister(h *handle) {
	r := &d.reg
	r.mu.Lock()
	if r.keys[h.key] == h {
		delete(r.keys, h.key)
	}
	r.mu.Unlock()
}

// settle records the create revision of a registered handle's key and
// applies the events seen before. waiting: the key is a waiter's, kept
// alive by its wait; else a holder's, valid until its etcd lease's expiry.
func (d *driver) settle(h *handle, rev int64, waiting bool) {
	r := &d.reg
	r.mu.Lock()
	h.rev, h.waiting = rev, waiting
	if !waiting {
		h.until = h.l.lastSent().Add(h.l.granted)
	}
	var lost []func()
	for _, ev := range h.pending {
		if f := d.judge(h, ev); f != nil {
			lost = append(lost, f)
		}
	}
	h.pending = nil
	r.mu.Unlock()
	for _, f := range lost {
		f()
	}
}

// hold keeps the events on a handle's key in pending while its release is
// in flight (its own deletion is not a loss); unheld, it applies them.
func (d *driver) hold(h *handle, on bool) {
	r := &d.reg
	r.mu.Lock()
	h.releasing = on
	var lost []func()
	if !on {
		for _, ev := range h.pending {
			if f := d.judge(h, ev); f != nil {
				lost = append(lost, f)
			}
		}
		h.pending = nil
	}
	r.mu.Unlock()
	for _, f := range lost {
		f()
	}
}

// judge applies an event on a handle's key once its create revision is
// known, and returns the loss callback to call when it ends the lease;
// r.mu held.
func (d *driver) judge(h *handle, ev *clientv3.Event) func() {
	if h.lostWhy != "" || ev.Kv.ModRevision <= h.rev {
		return nil
	}
	switch {
	case ev.Type == mvccpb.DELETE || ev.Kv.CreateRevision != h.rev:
		return h.lose(fmt.Sprintf("%q was deleted", h.key))
	case clientv3.LeaseID(ev.Kv.Lease) != h.l.id && (h.moving == nil || clientv3.LeaseID(ev.Kv.Lease) != h.moving.id):
		return h.lose(fmt.Sprintf("%q was rebound to another etcd lease", h.key))
	}
	return nil
}

// lose marks the handle lost and returns its loss callback (nil if none
// yet); r.mu held.
func (h *handle) lose(why string) func() {
	if h.lostWhy != "" {
		return nil
	}
	h.lostWhy = why
	return h.onLost
}

// OnLost implements dlockdriver.LossNotifier: f is called when the watch
// finds the lock's key gone.
func (h *handle) OnLost(f func()) {
	r := &h.d.reg
	r.mu.Lock()
	lost := h.lostWhy != ""
	h.onLost = f
	r.mu.Unlock()
	if lost && h.l.shared {
		f()
	}
}

// watchLoop follows the prefix until ctx ends, setting its watch up again
// when it breaks (from where it was, or after reading every registered key
// when the revisions it needs were compacted), and reaps expired and
// abandoned keys.
func (d *driver) watchLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	reap := time.NewTicker(reapEvery)
	defer reap.Stop()
	for ctx.Err() == nil {
		r := &d.reg
		r.mu.Lock()
		from := r.rev + 1
		r.mu.Unlock()
		wctx, cancel := context.WithCancel(watchCtx(ctx))
		wc := d.c.Watch(wctx, d.prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
		compacted, idle := d.follow(ctx, wc, reap.C)
		cancel()
		for range wc { // drain
		}
		if ctx.Err() != nil || idle {
			return
		}
		if compacted {
			if err := d.resync(ctx); err == nil {
				continue
			}
		}
		t := time.NewTimer(watchRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// follow applies the watch's events until it breaks or the Locker has been
// idle for idleWatch; it reports whether it broke because the revisions it
// needed were compacted, or stopped for idleness.
func (d *driver) follow(ctx context.Context, wc clientv3.WatchChan, reap <-chan time.Time) (compacted, idle bool) {
	for {
		select {
		case <-ctx.Done():
			return false, false
		case now := <-reap:
			d.reap(ctx)
			if d.idle(now) {
				return false, true
			}
		case wr, ok := <-wc:
			if !ok {
				return false, false
			}
			if wr.CompactRevision != 0 {
				if watchEnded != nil {
					watchEnded(wr)
				}
				return true, false
			}
			if wr.Canceled || wr.Err() != nil {
				return false, false
			}
			d.apply(ctx, wr)
		}
	}
}

// apply applies one watch response: events on registered keys go to their
// handles, a key put on one of the Locker's shared etcd leases that nobody
// registers (an abandoned attempt's put applied late) is deleted, and the
// watched revision advances.
func (d *driver) apply(ctx context.Context, wr clientv3.WatchResponse) {
	r := &d.reg
	var lost []func()
	var orphans []*mvccpb.KeyValue
	r.mu.Lock()
	rev := r.rev
	for _, ev := range wr.Events {
		r.waitsEvent(ev)
		h := r.keys[string(ev.Kv.Key)]
		switch {
		case h == nil:
			if ev.Type == mvccpb.PUT && r.ids[clientv3.LeaseID(ev.Kv.Lease)] && string(ev.Kv.Key) != r.marker {
				orphans = append(orphans, ev.Kv)
			}
		case h.rev == 0 || h.releasing:
			h.pending = append(h.pending, ev)
		default:
			if f := d.judge(h, ev); f != nil {
				lost = append(lost, f)
			}
		}
	}
	if n := len(wr.Events); n > 0 {
		// etcd sends a revision's events in one response (a watch without
		// fragmentation), in revision order.
		rev = max(rev, wr.Events[n-1].Kv.ModRevision)
	}
	if rev > r.rev {
		r.rev = rev
		close(r.moved)
		r.moved = make(chan struct{})
	}
	r.mu.Unlock()
	for _, f := range lost {
		f()
	}
	for _, kv := range orphans {
		cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		_, _ = d.c.Txn(cctx).
			If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit()
		cancel()
	}
}

// mark puts the Locker's marker key, bound to one of leases (the first
// still alive), and returns the revision of the put: once the watch has
// delivered that event, it has delivered every change made before the put.
// The key goes with its etcd lease.
func (d *driver) mark(ctx context.Context, leases []*lease) (int64, error) {
	var err error
	for _, l := range leases {
		var resp *clientv3.PutResponse
		resp, err = d.c.Put(ctx, d.reg.marker, "", clientv3.WithLease(l.id))
		if err == nil {
			return resp.Header.Revision, nil
		}
		if !leaseGone(err) {
			break
		}
	}
	return 0, err
}

// caughtUp waits until the watch has applied every event up to rev, the
// revision of a linearizable read. When the watch has not got there within
// markAfter (the revision moved outside the prefix, where the watch sees
// nothing), it puts the marker key and waits for that event instead. (A
// requested progress notification would cost no write, but servers before
// etcd 3.4.25 and 3.5.8 may send it ahead of events still queued: etcd
// issue 15220.)
func (d *driver) caughtUp(ctx context.Context, rev int64, leases []*lease) error {
	wctx, cancel := context.WithTimeout(ctx, markAfter)
	err := d.watched(wctx, rev)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	if rev, err = d.mark(ctx, leases); err != nil {
		return err
	}
	return d.watched(ctx, rev)
}

// markAfter is how long a refresh waits for the watch to reach the revision
// it read before it puts the marker key.
const markAfter = 20 * time.Millisecond

// watched waits until the watch has applied every event up to rev.
func (d *driver) watched(ctx context.Context, rev int64) error {
	r := &d.reg
	for {
		r.mu.Lock()
		at, moved := r.rev, r.moved
		r.mu.Unlock()
		if at >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-moved:
		}
	}
}

// reap deletes the keys of holders whose own TTL has run out without a
// refresh (their etcd lease is kept alive by others), and abandoned keys;
// it ends the former's leases.
func (d *driver) reap(ctx context.Context) {
	r := &d.reg
	now := time.Now()
	type doomed struct {
		h   *handle
		rev int64
	}
	var gone []doomed
	var lost []func()
	r.mu.Lock()
	for _, h := range r.keys {
		switch {
		case h.abandoned:
			gone = append(gone, doomed{h, 0})
		case h.rev != 0 && !h.waiting && h.lostWhy == "" && now.After(h.until):
			if f := h.lose(fmt.Sprintf("%q was not refreshed within its TTL", h.key)); f != nil {
				lost = append(lost, f)
			}
			gone = append(gone, doomed{h, h.rev})
		}
	}
	r.mu.Unlock()
	for _, f := range lost {
		f()
	}
	for _, g := range gone {
		cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		var err error
		if g.rev == 0 {
			_, err = d.c.Delete(cctx, g.h.key)
		} else {
			_, err = d.c.Txn(cctx).If(g.h.isOurs()).Then(clientv3.OpDelete(g.h.key)).Commit()
		}
		cancel()
		if err == nil {
			d.unregister(g.h)
		}
	}
}

// abandon deletes the key of a lock on a shared etcd lease that was put, or
// may have been, and will not be held (the etcd lease cannot be revoked:
// others' keys are on it). If the deletion fails the watch loop retries it;
// a put applied after it is deleted as an orphan. It returns within
// cleanupGrace (see cleanUp).
func (d *driver) abandon(ctx context.Context, h *handle) {
	d.cleanUp(ctx, func(cctx context.Context) { d.abandonNow(cctx, h) })
}

func (d *driver) abandonNow(cctx context.Context, h *handle) {
	if _, err := d.c.Delete(cctx, h.key); err == nil {
		d.unregister(h)
		return
	}
	r := &d.reg
	r.mu.Lock()
	h.abandoned = true
	r.mu.Unlock()
}

// resync reads every registered key after the watch lost revisions to a
// compaction, judges each as the missed events would have, and moves the
// watch on to the revision read.
func (d *driver) resync(ctx context.Context) error {
	r := &d.reg
	r.mu.Lock()
	hs := make([]*handle, 0, len(r.keys))
	for _, h := range r.keys {
		hs = append(hs, h)
	}
	r.mu.Unlock()
	first, err := d.c.Get(ctx, d.prefix, clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	kvs := make([]*mvccpb.KeyValue, len(hs))
	for start := 0; start < len(hs); start += maxTxnOps {
		end := min(start+maxTxnOps, len(hs))
		ops := make([]clientv3.Op, 0, end-start)
		for _, h := range hs[start:end] {
			ops = append(ops, clientv3.OpGet(h.key))
		}
		resp, err := d.c.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		for j, rr := range resp.Responses {
			if got := rr.GetResponseRange().GetKvs(); len(got) > 0 {
				kvs[start+j] = got[0]
			} else {
				kvs[start+j] = &mvccpb.KeyValue{Key: []byte(hs[start+j].key), ModRevision: resp.Header.Revision}
			}
		}
	}
	var lost []func()
	r.mu.Lock()
	for i, h := range hs {
		ev := &clientv3.Event{Type: mvccpb.PUT, Kv: kvs[i]}
		if kvs[i].CreateRevision == 0 {
			ev.Type = mvccpb.DELETE
		} else {
			// As of the read, which is after any missed event.
			ev.Kv = &mvccpb.KeyValue{Key: kvs[i].Key, CreateRevision: kvs[i].CreateRevision,
				ModRevision: max(kvs[i].ModRevision, first.Header.Revision), Lease: kvs[i].Lease}
		}
		if h.rev == 0 || h.releasing {
			h.pending = append(h.pending, ev)
		} else if f := d.judge(h, ev); f != nil {
			lost = append(lost, f)
		}
	}
	if first.Header.Revision > r.rev {
		r.rev = first.Header.Revision
		close(r.moved)
		r.moved = make(chan struct{})
	}
	r.waitsStale()
	r.mu.Unlock()
	for _, f := range lost {
		f()
	}
	return nil
}

// refreshShared refreshes holders on shared etcd leases: one renewal per
// etcd lease and one linearizable read, then each key judged by what the
// watch has seen up to the revision read (see caughtUp).
func (d *driver) refreshShared(ctx context.Context, hs []*handle) ([]time.Duration, []error) {
	granted := make([]time.Duration, len(hs))
	errs := make([]error, len(hs))
	var leases []*lease
	seen := make(map[*lease]bool)
	for _, h := range hs {
		if !seen[h.l] {
			seen[h.l] = true
			leases = append(leases, h.l)
		}
	}
	sent := time.Now()
	var (
		wg    sync.WaitGroup
		rev   int64
		rerr  error
		kerrs = make(map[*lease]error, len(leases))
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := d.c.Get(ctx, d.reg.marker, clientv3.WithCountOnly())
		if err != nil {
			rerr = err
			return
		}
		rev = resp.Header.Revision
	}()
	for _, l := range leases {
		kerrs[l] = d.keepAlive(ctx, l)
		if leaseGone(kerrs[l]) {
			d.dropShared(l)
		}
	}
	wg.Wait()
	if rerr == nil {
		rerr = d.caughtUp(ctx, rev, leases)
	}
	r := &d.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, h := range hs {
		kerr := kerrs[h.l]
		switch {
		case h.lostWhy != "":
			errs[i] = h.notHeld(h.lostWhy)
		case leaseGone(kerr):
			errs[i] = h.notHeld(fmt.Sprintf("the etcd lease of %q has expired", h.key))
		case kerr != nil:
			errs[i] = fmt.Errorf("etcd: renewing the lease of %q: %w", h.key, kerr)
		case rerr != nil:
			errs[i] = fmt.Errorf("etcd: following the changes under %q: %w", d.prefix, rerr)
		default:
			h.until = sent.Add(h.l.granted)
			granted[i] = h.l.granted
		}
	}
	return granted, errs
}
