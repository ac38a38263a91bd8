package zookeeper

import (
	"context"
	"fmt"
	"sync"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// A refresh establishes two things: the lease's session is alive (its
// server-side timeout restarted no earlier than the refresh was sent), and
// the lease's node is still there in that session. Refresh does both with
// one exists request per lease. RefreshBatch does them for the leases of a
// driver's own session with one request per batch, whatever their number:
//
//   - Each lease's node carries an exists watch, set by the lease's first
//     batched refresh (an exists request with a watch, which checks the
//     node as Refresh does) and set again after it fires. The watch fires
//     when the node is deleted or its data changes, and is dropped when the
//     session ends.
//   - One read on the session (an exists of "/", the probe) is sent when
//     the batch starts. Its answer proves the session alive as of then,
//     and since a ZooKeeper server sends a connection's watch events in
//     order with its replies, and go-zookeeper handles both in order on one
//     goroutine, every watch the connection holds for a change the server
//     had applied when it answered has fired when the probe returns. A
//     lease whose watch has not fired then still has its node, as an
//     exists request sent at that time would have found.
//
// A server keeps a watch on the connection that set it: after a
// reconnection go-zookeeper sets the watches again, but in a request of its
// own that the probe may overtake. A watch therefore counts only for probes
// sent and answered on the connection that set it (the session's epoch);
// after a reconnection each lease sets its watch again, at most
// maxRearms times (go-zookeeper keeps every watch set on a node until it
// fires), and is refreshed alone after that.
//
// A lease whose watch fired is checked again, as on its first batched
// refresh. go-zookeeper cannot remove a watch: a lease's watch goes when
// its node is deleted (released, expired, or gone with its session), which
// the lease's end always does.

// armWorkers bounds the exists requests a batch has in flight at once.
const armWorkers = 32

// maxRearms bounds the watches a lease sets on its node while an earlier
// one may still be registered (after reconnections).
const maxRearms = 4

// RefreshBatch refreshes many leases (dlockdriver.BatchRefresher) as
// Refresh does each one, with one probe per session for the leases whose
// watch is in place and one exists request (with a watch) for the others.
// A lease on the application's connection (New), or whose TTL asks for
// another session, is refreshed alone.
func (d *driver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	granted := make([]time.Duration, len(hs))
	errs := make([]error, len(hs))
	type group struct {
		g       *generation
		epoch   uint64
		watched []int // handles whose watch is in place on this connection
		arm     []int // handles whose watch must be set
	}
	groups := map[*session]*group{}
	var alone []int
	for i, x := range hs {
		h, ok := x.(*handle)
		if !ok {
			alone = append(alone, i)
			continue
		}
		h.mu.Lock()
		st, s, g, watch, epoch, rearms := h.state, h.s, h.gen, h.watch, h.watchEpoch, h.rearms
		h.mu.Unlock()
		switch {
		case st != held:
			errs[i] = h.notHeld("was deleted (its TTL passed, or its session ended)")
			continue
		case !s.owned || (ttls[i]+time.Millisecond-1)/time.Millisecond != time.Duration(s.key):
			alone = append(alone, i) // moves it, or refuses the TTL
			continue
		}
		gr := groups[s]
		if gr == nil {
			gr = &group{}
			gr.g, gr.epoch = s.connEpoch()
			groups[s] = gr
		}
		switch {
		case gr.g != g:
			// Its generation is over, or not yet known to be live.
			alone = append(alone, i)
		case watch != nil && epoch == gr.epoch:
			gr.watched = append(gr.watched, i)
		case watch != nil && rearms >= maxRearms:
			alone = append(alone, i)
		default:
			gr.arm = append(gr.arm, i)
		}
	}
	parallel(alone, func(i int) { granted[i], errs[i] = hs[i].Refresh(ctx, ttls[i]) })
	for s, gr := range groups {
		sent := time.Now()
		var (
			wg    sync.WaitGroup
			probe error
		)
		if len(gr.watched) > 0 {
			wg.Go(func() {
				probe = s.do(ctx, func() error {
					_, _, err := s.conn.Exists("/")
					return err
				}, nil)
			})
		}
		parallel(gr.arm, func(i int) { granted[i], errs[i] = hs[i].(*handle).arm(ctx, s, gr.g, sent) })
		wg.Wait()
		if len(gr.watched) == 0 {
			continue
		}
		if g, epoch := s.connEpoch(); probe == nil && (g != gr.g || epoch != gr.epoch) {
			probe = errNoSession // reconnected: a watch may have missed a change
		}
		var again []int
		for _, i := range gr.watched {
			h := hs[i].(*handle)
			switch {
			case probe != nil:
				errs[i] = fmt.Errorf("zookeeper: refreshing %s with %d other nodes of its session: %w", h.path, len(gr.watched)-1, probe)
			case h.watchFired():
				again = append(again, i)
			default:
				granted[i], errs[i] = h.refreshed(s, gr.g, sent)
			}
		}
		sent = time.Now()
		parallel(again, func(i int) { granted[i], errs[i] = hs[i].(*handle).arm(ctx, s, gr.g, sent) })
	}
	return granted, errs
}

// parallel runs f for each of idx, up to armWorkers at a time.
func parallel(idx []int, f func(int)) {
	if len(idx) == 0 {
		return
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(len(idx), armWorkers) {
		wg.Go(func() {
			for i := range work {
				f(i)
			}
		})
	}
	for _, i := range idx {
		work <- i
	}
	close(work)
	wg.Wait()
}

// arm checks, as Refresh does, that the node is there in generation g of
// owned session s, with an exists request that sets a watch on it, and
// makes that the lease's watch; the refresh counts from sent.
func (h *handle) arm(ctx context.Context, s *session, g *generation, sent time.Time) (time.Duration, error) {
	g0, epoch := s.connEpoch()
	if g0 != g {
		return 0, h.notHeld("went with its session")
	}
	var (
		ok    bool
		stat  *zk.Stat
		watch <-chan zk.Event
	)
	err := s.do(ctx, func() (err error) {
		ok, stat, watch, err = s.conn.ExistsW(h.path)
		return err
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("zookeeper: refreshing %s: %w", h.path, err)
	}
	if !ok || stat.EphemeralOwner != g.sid {
		h.drop(ok)
		return 0, h.notHeld("is gone, or no longer in the lease's session")
	}
	if _, e := s.connEpoch(); e != epoch {
		epoch = 0 // set on one connection or the next: not to be counted on
	}
	h.mu.Lock()
	if h.state == held && h.gen == g {
		select {
		case <-h.watch: // fired (or nil)
		default:
			h.rearms++ // the earlier watch has not fired: it stays registered
		}
		h.watch, h.watchEpoch = watch, epoch
	}
	h.mu.Unlock()
	return h.refreshed(s, g, sent)
}

// watchFired reports whether the lease's watch has fired (or was dropped
// with its session); it is then no longer the lease's.
func (h *handle) watchFired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.watch:
		h.watch = nil
		return true
	default:
		return false
	}
}

// refreshed applies a refresh of the lease in generation g of owned session
// s, its checks sent at sent: the expiry timer moves to the session's
// timeout after that.
func (h *handle) refreshed(s *session, g *generation, sent time.Time) (time.Duration, error) {
	live := s.isLive(g)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != held || h.gen != g || !live {
		return 0, h.notHeld("was deleted (its TTL passed, or its session ended)")
	}
	h.ttl = g.timeout
	h.expiry.Reset(time.Until(sent.Add(g.timeout)))
	return g.timeout, nil
}

var _ dlockdriver.BatchRefresher = (*driver)(nil)
