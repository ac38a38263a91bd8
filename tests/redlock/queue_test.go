package redlock_test

import (
	"context"
	"github.com/dlock/dlock/tests/internal/testutil"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	goredis "github.com/redis/go-redis/v9"
)

// queueLen is the number of tickets in name's queue on the node.
func queueLen(ctx context.Context, t *testing.T, r *goredis.Client, name string) int64 {
	t.Helper()
	n, err := r.ZCard(ctx, lockKey(name)+":waiters").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// holdEverywhere takes name with a TTL of 20s for a test whose waiters must
// queue on every node: a lease may hold on a majority only (under load a
// node's request can outlast the node timeout), and a node where the lock
// is free queues nobody (each attempt takes it there, is refused by the
// rest and gives it back). It takes the name again until it is held on
// every node.
func holdEverywhere(ctx context.Context, t *testing.T, c *cluster, holder *dlock.Locker, name string) *dlock.Lease {
	t.Helper()
	for try := 0; ; try++ {
		ls, err := holder.TryAcquire(ctx, name, &dlock.Options{TTL: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Second)
		for {
			on := 0
			for _, r := range c.raws {
				if v, _ := r.Get(ctx, lockKey(name)).Result(); v != "" {
					on++
				}
			}
			if on == len(c.raws) {
				return ls
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if try == 9 {
			t.Fatalf("%q held on a majority only in 10 acquisitions", name)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Waiters are served in the order they began to wait: three waiters, each
// its own Locker, queued one after another behind a holder, are granted in
// that order, each handed the lock by the previous one's release, which
// grants it on every node in its script (the lock is never free between
// them, and each grant's fencing token is above the last); and no queue or
// lock is left once all have released.
func TestQueueOrder(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	holder := newLocker(t, c.clients(t), nil)
	name := "queue-" + testutil.RandomHex(4)
	ls := holdEverywhere(ctx, t, c, holder, name)
	const waiters = 3
	granted := make(chan int, waiters)
	leases := make([]*dlock.Lease, waiters)
	errs := make(chan error, waiters)
	for w := range waiters {
		l := newLocker(t, c.clients(t), nil)
		go func() {
			lw, err := l.Acquire(ctx, name, &dlock.Options{TTL: 20 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			leases[w] = lw
			granted <- w
		}()
		// The next waiter starts once this one is queued on a majority (its
		// busy attempt registers it; the requests to the other nodes may
		// still be running): tickets are scored by when their waiter began
		// to wait, the same on every node, so the order holds either way.
		eventually(t, live(t, registerBound), "the waiter queued on a majority", func() bool {
			queued := 0
			for _, r := range c.raws {
				if queueLen(ctx, t, r, name) >= int64(w+1) {
					queued++
				}
			}
			return queued >= len(c.raws)/2+1
		})
	}
	// handedOn asserts that the release that just returned handed the lock
	// on: a majority of nodes holds it (for the next waiter; a node whose
	// subscription was being renewed under load skips it, and is free).
	handedOn := func(from string) {
		t.Helper()
		held := 0
		for _, r := range c.raws {
			if v, err := r.Get(ctx, lockKey(name)).Result(); err == nil && v != "" {
				held++
			}
		}
		if held < len(c.raws)/2+1 {
			t.Fatalf("right after %s's release the lock is held on %d of %d nodes; want it handed to the next waiter on a majority", from, held, len(c.raws))
		}
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	handedOn("the holder")
	last, _ := ls.Fence()
	for want := range waiters {
		select {
		case got := <-granted:
			if got != want {
				t.Fatalf("waiter %d granted; want waiter %d, the first in the queue", got, want)
			}
			f, _ := leases[got].Fence()
			if f <= last {
				t.Fatalf("waiter %d granted with fencing token %d, not above the previous %d", got, f, last)
			}
			last = f
			// The next waiter stays queued while this one holds.
			select {
			case other := <-granted:
				t.Fatalf("waiter %d granted while waiter %d holds", other, got)
			case <-time.After(20 * time.Millisecond):
			}
			if err := leases[got].Release(ctx); err != nil {
				t.Fatal(err)
			}
			if got < waiters-1 {
				handedOn("waiter " + strconv.Itoa(got))
			}
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted within 10s", want)
		}
	}
	// A waiter granted by a majority removes its ticket from the other
	// nodes in the background.
	eventually(t, 5*time.Second, "no queue or lock left after every waiter released", func() bool {
		for _, r := range c.raws {
			n, err := r.Exists(ctx, lockKey(name)+":waiters", lockKey(name)).Result()
			if err != nil || n != 0 {
				return false
			}
		}
		return true
	})
}

// A ticket whose Locker no longer listens (a process that died while
// waiting) is skipped: the lock is never set to its hand-off token, and the
// release goes to the next waiter at once, not after the waiter's fallback.
func TestQueueDeadTicket(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	holder := newLocker(t, c.clients(t), nil)
	waiter := newLocker(t, c.clients(t), nil)
	name := "dead-" + testutil.RandomHex(4)
	ls := holdEverywhere(ctx, t, c, holder, name)
	// A dead process's ticket, first in the queue on every node.
	const deadToken = "0123456789abcdef0123456789abcdef"
	for _, r := range c.raws {
		if err := r.ZAdd(ctx, lockKey(name)+":waiters", goredis.Z{Score: 1, Member: "0123456789abcdef:" + deadToken + ":20000"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		ls  *dlock.Lease
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, name, nil)
		done <- result{l, err, time.Now()}
	}()
	eventually(t, live(t, registerBound), "the waiter queued behind the dead ticket on every node", func() bool {
		for _, r := range c.raws {
			if queueLen(ctx, t, r, name) != 2 {
				return false
			}
		}
		return true
	})
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() { _ = r.ls.Release(ctx) }()
	for i, rc := range c.raws {
		if v, _ := rc.Get(ctx, lockKey(name)).Result(); v == deadToken {
			t.Errorf("node %d handed the lock to the dead waiter", i)
		}
	}
	// The fallback would wake the waiter 200ms or more after it last was.
	if lag := r.at.Sub(released); lag > 150*time.Millisecond {
		t.Errorf("waiter granted %v after the release; want well within its 200ms fallback", lag)
	}
	eventually(t, 5*time.Second, "the dead ticket dropped and the waiter's removed", func() bool {
		for _, r := range c.raws {
			if queueLen(ctx, t, r, name) != 0 {
				return false
			}
		}
		return true
	})
}

// A release handed to a waiter that has left while its Locker still
// listens (its ticket put back after it left, as a registration landing
// late would) is given back by that Locker (the lock no longer holds the
// left wait's hand-off token) and handed to the next waiter at once, not
// after the next waiter's fallback.
func TestQueuePassOn(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	holder := newLocker(t, c.clients(t), nil)
	left := newLocker(t, c.clients(t), nil)
	waiter := newLocker(t, c.clients(t), nil)
	name := "passon-" + testutil.RandomHex(4)
	queue := lockKey(name) + ":waiters"
	ls := holdEverywhere(ctx, t, c, holder, name)
	lctx, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := left.Acquire(lctx, name, nil)
		gone <- err
	}()
	eventually(t, live(t, registerBound), "the first waiter queued on every node", func() bool {
		for _, r := range c.raws {
			if queueLen(ctx, t, r, name) != 1 {
				return false
			}
		}
		return true
	})
	ticket, err := c.raws[0].ZRange(ctx, queue, 0, 0).Result()
	if err != nil || len(ticket) != 1 {
		t.Fatalf("the first waiter's ticket: %v, %v", ticket, err)
	}
	cancel()
	<-gone
	// A waiter that leaves removes its ticket on a majority before its
	// Acquire returns, and on the rest in the background.
	gone0 := 0
	for _, r := range c.raws {
		if queueLen(ctx, t, r, name) == 0 {
			gone0++
		}
	}
	if gone0 < len(c.raws)/2+1 {
		t.Fatalf("the first waiter's ticket is gone on %d of %d nodes when its Acquire returned; want a majority", gone0, len(c.raws))
	}
	eventually(t, 5*time.Second, "the first waiter's ticket gone on every node", func() bool {
		for _, r := range c.raws {
			if queueLen(ctx, t, r, name) != 0 {
				return false
			}
		}
		return true
	})
	for _, r := range c.raws {
		if err := r.ZAdd(ctx, queue, goredis.Z{Score: 1, Member: ticket[0]}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		ls  *dlock.Lease
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, name, nil)
		done <- result{l, err, time.Now()}
	}()
	eventually(t, live(t, registerBound), "the second waiter queued on every node", func() bool {
		for _, r := range c.raws {
			if queueLen(ctx, t, r, name) != 2 {
				return false
			}
		}
		return true
	})
	start := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	took := released.Sub(start)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() { _ = r.ls.Release(ctx) }()
	// Timed from the release's return, with twice the release's own time
	// on top: the pass-on is a few round trips like it, each slower on a
	// loaded machine (busy run 12: 210ms from before the release's call).
	if lag := r.at.Sub(released); lag > 120*time.Millisecond+2*took {
		t.Errorf("second waiter granted %v after the release returned (which took %v); want well within its 200ms fallback", lag, took)
	}
	parts := strings.Split(ticket[0], ":")
	if len(parts) != 3 {
		t.Fatalf("ticket %q: want <locker>:<wait>:<ttl>", ticket[0])
	}
	// Given back on a majority at once (the second waiter holds it there),
	// on every node soon after (in the background).
	eventually(t, 5*time.Second, "no node holds the lock for the waiter that left", func() bool {
		for _, rc := range c.raws {
			if v, _ := rc.Get(ctx, lockKey(name)).Result(); v == parts[1] {
				return false
			}
		}
		return true
	})
}

// A lease granted by hand-offs is valid no longer than the lock lives on a
// majority of nodes: its validity counts from when its wait began (every
// handing node set the lock later, for the full TTL), and when that leaves
// less than two thirds of the TTL, the lock is refreshed first and the
// validity counts from the refresh. Both cases: a release as soon as the
// waiter is queued, and one half a TTL after it began to wait.
func TestQueueHandoffValidity(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	holder := newLocker(t, c.clients(t), nil)
	waiter := newLocker(t, c.clients(t), nil)
	const ttl = 2 * time.Second
	for _, hold := range []time.Duration{0, ttl / 2} {
		name := "validity-" + testutil.RandomHex(4)
		ls := holdEverywhere(ctx, t, c, holder, name)
		type result struct {
			ls    *dlock.Lease
			err   error
			at    time.Time
			until time.Time
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			l, err := waiter.Acquire(ctx, name, &dlock.Options{TTL: ttl, NoRefresh: true})
			r := result{ls: l, err: err, at: time.Now()}
			if err == nil {
				r.until = l.ValidUntil()
			}
			done <- r
		}()
		eventually(t, live(t, registerBound), "the waiter queued on every node", func() bool {
			for _, r := range c.raws {
				if queueLen(ctx, t, r, name) != 1 {
					return false
				}
			}
			return true
		})
		time.Sleep(time.Until(start.Add(hold))) // the wait's age is the subject
		releasing := time.Now()
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		// Safety: a majority of nodes keeps the lock at least until the
		// lease's ValidUntil (PTTLs read after the validity left was).
		left, read := time.Until(r.until), time.Now()
		keep := 0
		for _, rc := range c.raws {
			pttl, err := rc.PTTL(ctx, lockKey(name)).Result()
			if err == nil && pttl+time.Since(read) >= left {
				keep++
			}
		}
		if keep < len(c.raws)/2+1 {
			t.Errorf("held %v: the lock outlives the lease's validity (%v left) on %d of %d nodes; want a majority", hold, left, keep, len(c.raws))
		}
		// The wait's age, not hold, decides: queueing took longer than
		// TTL/3 on a loaded machine (busy run 27), and the grant was then
		// refreshed first, as the hold > ttl/3 case checks.
		if age := releasing.Sub(start); age <= ttl/3 && r.until.After(releasing.Add(ttl)) {
			// The nodes set the lock once the release began, at the
			// earliest: counted from the wait's start, the validity ends
			// before that plus the TTL.
			t.Errorf("valid until %v after the release began; want at most the TTL %v", r.until.Sub(releasing), ttl)
		}
		if hold > ttl/3 {
			// Counted from the wait's start, the validity would end within
			// ttl-hold of the grant: the refresh gave it about a TTL.
			if v := r.until.Sub(r.at); v < ttl*6/10 {
				t.Errorf("held %v: granted with %v of validity; want the lock refreshed first (about %v)", hold, v, ttl)
			}
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
