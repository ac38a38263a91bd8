package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/tests/internal/testutil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/dlocktest"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// The fault tests run on 5 nodes: a majority is 3, so 2 may fail.

const (
	faultTTL     = 3 * time.Second
	nodeTimeout  = 300 * time.Millisecond
	slackTimeout = 400 * time.Millisecond // scheduling slack on a loaded machine
)

// slack is slackTimeout scaled by DLOCK_TOLERANCE_SCALE: how much later
// than the node timeout an operation may return (a liveness bound).
func slack(t testing.TB) time.Duration {
	t.Helper()
	d, err := conformance.Live(slackTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// live is d scaled by DLOCK_TOLERANCE_SCALE.
// registerBound bounds the wait for a waiter to show in the queue of every
// node it reaches, the lock being held on every node (holdEverywhere: a
// node where it is free queues nobody). An attempt whose request to a node
// took longer than the node timeout (a loaded machine) does not register
// there; the waiter looks again at its fallback, within 2×fallbackMax
// (6.4s). It is a precondition's wait, not what the tests check.
const registerBound = 20 * time.Second

func live(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	d, err := conformance.Live(d)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func lockKey(name string) string { return redlock.DefaultKeyPrefix + "{" + name + "}" }

func fenceKey(name string) string { return lockKey(name) + ":fence" }

// fault is a way to take nodes out and bring them back.
type fault struct {
	name    string
	apply   func(*dlocktest.Server, context.Context) error
	restore func(*dlocktest.Server, context.Context) error
}

var (
	pause = fault{"paused", (*dlocktest.Server).Pause, (*dlocktest.Server).Unpause}
	kill  = fault{"killed", (*dlocktest.Server).Stop, (*dlocktest.Server).Start}
)

// breakNodes applies f to the given nodes at once and restores them at
// cleanup (or when the returned func is called, whichever comes first).
func (c *cluster) breakNodes(t *testing.T, f fault, nodes ...int) (restore func()) {
	t.Helper()
	run := func(op func(*dlocktest.Server, context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		errs := make([]error, len(nodes))
		var wg sync.WaitGroup
		for k, i := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[k] = op(c.srvs[i], ctx)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := run(f.apply); err != nil {
		t.Fatalf("%s nodes %v: %v", f.name, nodes, err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if err := run(f.restore); err != nil {
				t.Errorf("restoring nodes %v: %v", nodes, err)
			}
		})
	}
	t.Cleanup(restore)
	return restore
}

// liveHolders counts, among the given nodes, those on which key holds value.
func (c *cluster) liveHolders(t testing.TB, key, value string, nodes ...int) int {
	t.Helper()
	n := 0
	for _, i := range nodes {
		v, err := c.raws[i].Get(context.Background(), key).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatalf("GET %s on node %d: %v", key, i, err)
		}
		if err == nil && v == value {
			n++
		}
	}
	return n
}

// within polls cond every 10ms for up to d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// eventually polls cond every 10ms for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A minority of nodes (2 of 5) paused or killed, before an acquisition or
// while a lease is held: acquire, refresh, Held and release all still work,
// a contender is refused, and a paused node stalls nothing past the node
// timeout (the acquisition does not wait for it at all: a majority decides).
func TestMinorityDown(t *testing.T) {
	c := newCluster(t, 5, nil)
	live := []int{0, 1, 2}
	opts := &redlock.Options{NodeTimeout: nodeTimeout, Defaults: dlock.Options{TTL: faultTTL}}
	for _, f := range []fault{pause, kill} {
		for _, holding := range []bool{false, true} {
			when := "before acquiring"
			if holding {
				when = "while holding"
			}
			t.Run(f.name+" "+when, func(t *testing.T) {
				ctx := testutil.Ctx(t)
				l := newLocker(t, c.clients(t), opts)
				contender := newLocker(t, c.clients(t), opts)
				name := "minority-" + testutil.RandomHex(4)
				key := lockKey(name)
				// Warm both lockers up: connections and scripts. That is
				// what a first request pays (a dial through the engine's
				// port mapping and script loading, which took more than the
				// node timeout on a loaded machine), so Acquire: it tries
				// again.
				for _, w := range []*dlock.Locker{l, contender} {
					ls, err := w.Acquire(ctx, name+"-warm", nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := ls.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}

				var ls *dlock.Lease
				acquire := func() {
					t.Helper()
					start := time.Now()
					var err error
					ls, err = l.TryAcquire(ctx, name, nil)
					granted := time.Now()
					if err != nil {
						t.Fatalf("TryAcquire with nodes 3, 4 %s: %v", f.name, err)
					}
					took := granted.Sub(start)
					t.Logf("acquired in %v", took)
					if took > nodeTimeout+slack(t) {
						t.Errorf("TryAcquire took %v; want within the node timeout %v (+%v slack)", took, nodeTimeout, slack(t))
					}
					// The Locker reads its clock (ValidUntil's start) after
					// start and before the grant is known: ValidUntil is
					// TTL - drift past a moment between the two, however
					// long the scheduler kept either side waiting.
					valid := faultTTL - faultTTL/100 - 2*time.Millisecond
					if lo, hi := start.Add(valid), granted.Add(valid); ls.ValidUntil().Before(lo) || ls.ValidUntil().After(hi) {
						t.Errorf("ValidUntil is %v past start + TTL - drift, %v past grant + TTL - drift; want it between the two",
							ls.ValidUntil().Sub(lo), ls.ValidUntil().Sub(hi))
					}
				}
				var restore func()
				if holding {
					acquire()
					restore = c.breakNodes(t, f, 3, 4)
				} else {
					restore = c.breakNodes(t, f, 3, 4)
					acquire()
				}
				if n := c.liveHolders(t, key, ls.Token(), live...); n != 3 {
					t.Fatalf("the lock is on %d of the 3 live nodes, want 3", n)
				}

				before := ls.ValidUntil()
				time.Sleep(20 * time.Millisecond)
				start := time.Now()
				if err := ls.Refresh(ctx, 0); err != nil {
					t.Fatalf("Refresh: %v", err)
				}
				if took := time.Since(start); took > nodeTimeout+slack(t) {
					t.Errorf("Refresh took %v; want within the node timeout", took)
				}
				if !ls.ValidUntil().After(before) {
					t.Errorf("Refresh did not move ValidUntil")
				}
				if ok, err := ls.Held(ctx); !ok || err != nil {
					t.Errorf("Held = %v, %v; want true", ok, err)
				}
				_, err := contender.TryAcquire(ctx, name, nil)
				var busy *dlockdriver.BusyError
				if !errors.As(err, &busy) || busy.RetryAfter < faultTTL/2 {
					t.Errorf("contender: %v; want a BusyError with about the TTL left", err)
				}

				start = time.Now()
				if err := ls.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
				if took := time.Since(start); took > nodeTimeout+slack(t) {
					t.Errorf("Release took %v; want within the node timeout", took)
				}
				for _, i := range live {
					if n, _ := c.raws[i].Exists(ctx, key).Result(); n != 0 {
						t.Errorf("the lock is still on live node %d after Release", i)
					}
				}
				ls2, err := contender.TryAcquire(ctx, name, nil)
				if err != nil {
					t.Fatalf("contender after Release: %v", err)
				}
				if err := ls2.Release(ctx); err != nil {
					t.Fatal(err)
				}
				restore()
			})
		}
	}
}

// A slow node in the majority: with 2 nodes down, the acquisition must wait
// for the third live node, and the lease's validity is shortened by the time
// that took (it counts from before the first request was sent).
func TestSlowNodeShortensValidity(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	clients, ps := c.proxied(t)
	l := newLocker(t, clients, &redlock.Options{NodeTimeout: time.Second})
	name := "slow-" + testutil.RandomHex(4)
	warm, err := l.TryAcquire(ctx, name+"-warm", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ps[3].Blackhole()
	ps[4].Blackhole()
	const lag = 100 * time.Millisecond
	ps[2].SetLatency(lag) // a round trip takes 2×lag
	start := time.Now()
	ls, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: faultTTL})
	granted := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	took := granted.Sub(start)
	left := ls.ValidUntil().Sub(granted)
	t.Logf("acquired in %v, valid for %v more", took, left)
	if took < 2*lag {
		t.Errorf("acquired in %v, before the slow node could answer (%v)", took, 2*lag)
	}
	if want := faultTTL - faultTTL/100 - 2*time.Millisecond - 2*lag; left > want {
		t.Errorf("valid for %v after the grant; want at most TTL - drift - the slow round trip = %v", left, want)
	}
	ps[2].SetLatency(0)
	ps[3].Heal()
	ps[4].Heal()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A majority that answers after the lease's validity (TTL - drift) has
// passed is ErrGrantExpired, not ErrNotAcquired (nobody else holds the
// lock: a TryAcquire must not read as "held", an Acquire keeps trying),
// and its nodes are given back.
func TestLateMajorityIsGrantExpired(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	clients, ps := c.proxied(t)
	// A drift of all but 100µs of the TTL leaves a validity that no round
	// trip through the proxies, each 2ms slower, can fit in; the TTL is
	// long, so that a node's lock that is gone was given back, not expired.
	const ttl = 10 * time.Second
	l := newLocker(t, clients, &redlock.Options{NodeTimeout: time.Second, Drift: ttl - 100*time.Microsecond})
	name := "late-" + testutil.RandomHex(4)
	for _, p := range ps {
		p.SetLatency(2 * time.Millisecond)
	}
	_, err := l.TryAcquire(ctx, name, &dlock.Options{TTL: ttl, NoRefresh: true})
	if !errors.Is(err, dlock.ErrGrantExpired) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire whose majority came after TTL - drift: got %v, want ErrGrantExpired and not ErrNotAcquired", err)
	}
	for _, p := range ps {
		p.SetLatency(0)
	}
	eventually(t, live(t, 2*time.Second), "the late majority's nodes given back", func() bool {
		return len(c.present(t, lockKey(name))) == 0
	})
}

// A majority of nodes (3 of 5) paused or killed: TryAcquire fails with
// ErrNoQuorum (not ErrNotAcquired: the lock is not held by anyone) within
// the node timeout, leaves nothing on the surviving nodes, and Acquire keeps
// trying until its ctx ends; a lease held when the majority went away
// cannot be refreshed and reports its loss by its ValidUntil.
func TestMajorityDown(t *testing.T) {
	c := newCluster(t, 5, nil)
	survivors := []int{0, 1}
	for _, f := range []fault{pause, kill} {
		t.Run(f.name, func(t *testing.T) {
			ctx := testutil.Ctx(t)
			opts := &redlock.Options{NodeTimeout: nodeTimeout, Defaults: dlock.Options{TTL: faultTTL}}
			l := newLocker(t, c.clients(t), opts)
			name := "majority-" + testutil.RandomHex(4)
			held, err := l.TryAcquire(ctx, name+"-held", nil)
			if err != nil {
				t.Fatal(err)
			}
			// When the loss is signalled, measured as it happens: the
			// Acquire below may still be waiting then.
			lostAt := make(chan time.Time, 1)
			go func() { <-held.Done(); lostAt <- time.Now() }()
			restore := c.breakNodes(t, f, 2, 3, 4)
			if err := held.Refresh(ctx, 0); !errors.Is(err, redlock.ErrNoQuorum) {
				t.Errorf("Refresh with 3 of 5 nodes %s: %v; want ErrNoQuorum", f.name, err)
			}

			start := time.Now()
			_, err = l.TryAcquire(ctx, name, nil)
			took := time.Since(start)
			t.Logf("TryAcquire failed in %v: %v", took, err)
			if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryAcquire with 3 of 5 nodes %s: %v; want ErrNoQuorum, not ErrNotAcquired", f.name, err)
			}
			if took > nodeTimeout+slack(t) {
				t.Errorf("TryAcquire took %v to fail; want within the node timeout %v", took, nodeTimeout)
			}
			// Liveness: generous on a loaded machine (busy run 12 missed 2s).
			eventually(t, 10*time.Second, "the failed attempt's keys removed from the survivors", func() bool {
				for _, i := range survivors {
					if n, _ := c.raws[i].Exists(ctx, lockKey(name)).Result(); n != 0 {
						return false
					}
				}
				return true
			})

			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = l.Acquire(actx, name, nil)
			cancel()
			if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redlock.ErrNoQuorum) {
				t.Errorf("Acquire with 3 of 5 nodes %s: %v; want ErrNotAcquired, DeadlineExceeded and ErrNoQuorum", f.name, err)
			}

			select {
			case at := <-lostAt:
				// A liveness bound: generous for a loaded 2-core machine.
				if late := at.Sub(held.ValidUntil()); late > 500*time.Millisecond {
					t.Errorf("loss signalled %v after ValidUntil", late)
				}
			case <-time.After(faultTTL + time.Second):
				t.Fatal("the lease held when the majority went away did not end")
			}
			if !errors.Is(held.Err(), dlock.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", held.Err())
			}
			restore()

			// Back to a majority: the name is free once the lost lease's keys
			// on the survivors have expired.
			ls, err := l.Acquire(ctx, name+"-held", nil)
			if err != nil {
				t.Fatalf("Acquire after the nodes came back: %v", err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Several lockers racing on 5 nodes, each nearest to a different node, so
// that every first attempt of a simultaneous start splits the vote: never
// two valid leases at once, fencing tokens in grant order, and every locker
// eventually gets its turns.
func TestSplitVote(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	const lockers, rounds = 5, 6
	const far = 20 * time.Millisecond
	ls := make([]*dlock.Locker, lockers)
	var all []proxies
	for j := range lockers {
		clients, ps := c.proxied(t)
		ls[j] = newLocker(t, clients, &redlock.Options{Defaults: dlock.Options{TTL: 2 * time.Second}})
		// The warm-up (not what the test checks) may meet a stall longer
		// than the node timeout on a loaded machine (busy run 12): Acquire
		// waits and tries again.
		warm, err := ls[j].Acquire(ctx, "split-warm-"+strconv.Itoa(j), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if i != j {
				p.SetLatency(far / 2)
			}
		}
		all = append(all, ps)
	}
	name := "split-" + testutil.RandomHex(4)

	// One simultaneous round of single attempts: at most one winner.
	var wg sync.WaitGroup
	gate := make(chan struct{})
	won := make([]*dlock.Lease, lockers)
	for j := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			l, err := ls[j].TryAcquire(ctx, name, nil)
			if err == nil {
				won[j] = l
			} else if !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("locker %d: %v; want ErrNotAcquired", j, err)
			}
		}()
	}
	close(gate)
	wg.Wait()
	winners := 0
	for _, l := range won {
		if l != nil {
			winners++
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("simultaneous single attempts: %d winner(s) of %d", winners, lockers)
	if winners > 1 {
		t.Fatalf("%d lockers won the same lock at once", winners)
	}

	// Racing waits: everyone gets every turn, one at a time.
	type grant struct {
		from, to time.Time
		fence    uint64
	}
	var (
		mu     sync.Mutex
		grants []grant
	)
	gate = make(chan struct{})
	for j := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for range rounds {
				l, err := ls[j].Acquire(ctx, name, nil)
				if err != nil {
					t.Errorf("locker %d: %v", j, err)
					return
				}
				from := time.Now()
				f, _ := l.Fence()
				time.Sleep(time.Millisecond)
				to := time.Now()
				if vu := l.ValidUntil(); vu.Before(to) {
					to = vu
				}
				mu.Lock()
				grants = append(grants, grant{from, to, f})
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Errorf("locker %d: Release: %v", j, err)
					return
				}
			}
		}()
	}
	close(gate)
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(grants) != lockers*rounds {
		t.Fatalf("%d grants, want %d", len(grants), lockers*rounds)
	}
	slices.SortFunc(grants, func(a, b grant) int { return a.from.Compare(b.from) })
	for i := 1; i < len(grants); i++ {
		a, b := grants[i-1], grants[i]
		if b.from.Before(a.to) {
			t.Errorf("leases overlap: [%v, %v] and [%v, %v]", a.from, a.to, b.from, b.to)
		}
		if b.fence <= a.fence {
			t.Errorf("fencing token %d granted after %d", b.fence, a.fence)
		}
	}
	for _, ps := range all {
		ps.SetLatency(0)
	}
	// The attempts that lost a vote gave their nodes back.
	eventually(t, 2*time.Second, "no lock left on any node", func() bool { return len(c.present(t, lockKey(name))) == 0 })
}

// Fencing across majorities that share one node: a holder's token is
// written to a whole majority before it is granted, so the next holder,
// whose majority has only one node in common with it, still counts past it;
// and nodes behind the token are raised to it.
func TestFenceAcrossMajorities(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	name := "fence-" + testutil.RandomHex(4)
	// Node 0's counter far ahead of everyone's: the first holder's token
	// comes from it.
	ahead := uint64(time.Now().Add(24 * time.Hour).UnixMicro())
	if err := c.raws[0].Set(ctx, fenceKey(name), ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	ca, pa := c.proxied(t)
	a := newLocker(t, ca, nil)
	cb, pb := c.proxied(t)
	b := newLocker(t, cb, nil)
	counters := func() []uint64 {
		out := make([]uint64, len(c.raws))
		for i, r := range c.raws {
			v, err := r.Get(ctx, fenceKey(name)).Uint64()
			if err != nil && !errors.Is(err, goredis.Nil) {
				t.Fatal(err)
			}
			out[i] = v
		}
		return out
	}

	// a reaches only nodes 0, 1, 2.
	pa[3].Blackhole()
	pa[4].Blackhole()
	la, err := a.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	fa, _ := la.Fence()
	got := counters()
	t.Logf("a's token %d; counters %v", fa, got)
	if fa != ahead+1 {
		t.Errorf("a's token %d, want node 0's counter + 1 = %d", fa, ahead+1)
	}
	for i := range 3 {
		if got[i] != fa {
			t.Errorf("node %d's counter %d after a's grant, want a's token %d written back", i, got[i], fa)
		}
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pa[3].Heal()
	pa[4].Heal()

	// b reaches only nodes 2, 3, 4: node 2 is the only one its majority
	// shares with a's.
	pb[0].Blackhole()
	pb[1].Blackhole()
	lb, err := b.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := lb.Fence()
	got = counters()
	t.Logf("b's token %d; counters %v", fb, got)
	if fb <= fa {
		t.Errorf("b's token %d does not exceed a's %d", fb, fa)
	}
	for i := 2; i < 5; i++ {
		if got[i] != fb {
			t.Errorf("node %d's counter %d after b's grant, want b's token %d", i, got[i], fb)
		}
	}
	pb[0].Heal()
	pb[1].Heal()
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter is notified of a release although a minority of nodes is down:
// its watch needs a majority of subscriptions, and the release is heard on
// one of them.
func TestNotifiedWithMinorityDown(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	// A long node timeout: a waiter that looked again too early, while the
	// releases were still on their way to some nodes, would stall on the
	// paused ones for that long.
	opts := &redlock.Options{NodeTimeout: 2 * time.Second}
	holder := newLocker(t, c.clients(t), opts)
	waiter := newLocker(t, c.clients(t), opts)
	name := "notified-" + testutil.RandomHex(4)
	ls := holdEverywhere(ctx, t, c, holder, name)
	c.breakNodes(t, pause, 0, 4)
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
	eventually(t, live(t, registerBound), "the waiter subscribed and queued on the live nodes", func() bool {
		for _, i := range []int{1, 2, 3} {
			if !queued(ctx, c.raws[i], name) {
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
	lag := r.at.Sub(released)
	t.Logf("granted %v after the release", lag)
	if lag > time.Second {
		t.Errorf("waiter granted %v after the release; want well within the holder's 20s and the 2s node timeout", lag)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// queued reports whether one waiter's ticket is in name's queue on the node
// and its Locker listens for hand-offs there.
// queueState describes name's queue and subscriptions on every node, for
// a failure message.
func queueState(ctx context.Context, c *cluster, name string) string {
	lockers := map[string]bool{}
	var b strings.Builder
	for i, r := range c.raws {
		tickets, err := r.ZRange(ctx, lockKey(name)+":waiters", 0, -1).Result()
		fmt.Fprintf(&b, "node %d: tickets %q (%v); ", i, tickets, err)
		for _, tk := range tickets {
			locker, _, _ := strings.Cut(tk, ":")
			lockers[locker] = true
		}
	}
	for i, r := range c.raws {
		for locker := range lockers {
			channel := lockKey(name) + ":released:" + locker
			m, err := r.PubSubNumSub(ctx, channel).Result()
			fmt.Fprintf(&b, "node %d: subscribers of %s: %d (%v); ", i, locker, m[channel], err)
		}
	}
	return b.String()
}

func queued(ctx context.Context, r *goredis.Client, name string) bool {
	tickets, err := r.ZRange(ctx, lockKey(name)+":waiters", 0, -1).Result()
	if err != nil || len(tickets) != 1 {
		return false
	}
	locker, _, _ := strings.Cut(tickets[0], ":")
	channel := lockKey(name) + ":released:" + locker
	m, err := r.PubSubNumSub(ctx, channel).Result()
	return err == nil && m[channel] == 1
}

// When every pub/sub connection of a waiter is reset, it subscribes again on
// new connections and is woken: a release reaches it within a fraction of a
// second, although the holder had 10s left.
func TestNotifiedAfterReset(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	holder := newLocker(t, c.clients(t), nil)
	clients, ps := c.proxied(t)
	waiter := newLocker(t, clients, nil)
	name := "reset-" + testutil.RandomHex(4)
	subscribed := func() bool {
		for _, r := range c.raws {
			if !queued(ctx, r, name) {
				return false
			}
		}
		return true
	}
	// Held on every node: a node where the lock is free queues nobody
	// (busy runs 16 and 17: the holder's request to node 2 had outlasted
	// the node timeout, and the waiter never showed in its queue).
	ls := holdEverywhere(ctx, t, c, holder, name)
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
	if !within(live(t, registerBound), subscribed) {
		t.Fatalf("the waiter subscribed on every node: not within %v: %s", live(t, registerBound), queueState(ctx, c, name))
	}
	// The pub/sub connections with a subscription, per node.
	subscribers := func() []string {
		ids := make([]string, len(c.raws))
		for i, r := range c.raws {
			list, err := r.ClientList(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(list, "\n") {
				var id string
				sub := false
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "id="); ok {
						id = v
					}
					if v, ok := strings.CutPrefix(f, "sub="); ok && v != "0" {
						sub = true
					}
				}
				if sub {
					ids[i] += id + " "
				}
			}
		}
		return ids
	}
	before := subscribers()
	ps.Reset()
	eventually(t, live(t, 10*time.Second), "the waiter subscribed again on every node, on new connections", func() bool {
		after := subscribers()
		for i := range after {
			if after[i] == "" || after[i] == before[i] {
				return false
			}
		}
		return subscribed()
	})
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	lag := r.at.Sub(released)
	t.Logf("granted %v after the release", lag)
	if lag > live(t, time.Second) {
		t.Errorf("waiter granted %v after the release; want within %v, well within the holder's 10s", lag, live(t, time.Second))
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// New rejects a node count Redlock cannot use, nil and repeated clients.
func TestNewInvalid(t *testing.T) {
	mk := func(n int) []goredis.UniversalClient {
		cs := make([]goredis.UniversalClient, n)
		for i := range cs {
			cs[i] = goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", 1+i), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = cs[i].Close() })
		}
		return cs
	}
	three := mk(3)
	noCtxTimeouts := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:9"})
	t.Cleanup(func() { _ = noCtxTimeouts.Close() })
	for _, tc := range []struct {
		what    string
		clients []goredis.UniversalClient
		opts    *redlock.Options
	}{
		{"no clients", nil, nil},
		{"one client", mk(1), nil},
		{"two clients", mk(2), nil},
		{"four clients", mk(4), nil},
		{"a nil client", []goredis.UniversalClient{three[0], nil, three[2]}, nil},
		{"a client twice", []goredis.UniversalClient{three[0], three[1], three[0]}, nil},
		{"negative node timeout", three, &redlock.Options{NodeTimeout: -time.Second}},
		{"negative drift", three, &redlock.Options{Drift: -time.Second}},
		{"TTL below the minimum", three, &redlock.Options{Defaults: dlock.Options{TTL: time.Millisecond}}},
		{"a client without ContextTimeoutEnabled", []goredis.UniversalClient{three[0], three[1], noCtxTimeouts}, nil},
	} {
		if l, err := redlock.New(tc.clients, tc.opts); !errors.Is(err, dlock.ErrInvalid) {
			if err == nil {
				_ = l.Close(context.Background())
			}
			t.Errorf("New with %s: %v; want ErrInvalid", tc.what, err)
		}
	}
}

// Every call honours its ctx when the locker's paths to all nodes are
// black-holed, even with a node timeout longer than the ctx.
func TestBlackholedCallsEndWithCtx(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 3, nil)
	clients, ps := c.proxied(t)
	l := newLocker(t, clients, &redlock.Options{NodeTimeout: 2 * time.Second})
	ls, err := l.TryAcquire(ctx, "blackholed", &dlock.Options{TTL: 5 * time.Second, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	ps.Blackhole()
	for _, op := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error { _, err := l.TryAcquire(ctx, "blackholed-2", nil); return err }},
		{"Acquire", func(ctx context.Context) error { _, err := l.Acquire(ctx, "blackholed-3", nil); return err }},
		{"Held", func(ctx context.Context) error { _, err := ls.Held(ctx); return err }},
		{"Refresh", func(ctx context.Context) error { return ls.Refresh(ctx, 0) }},
		{"Release", func(ctx context.Context) error { return ls.Release(ctx) }},
	} {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		err := op.fn(cctx)
		cancel()
		if took := time.Since(start); err == nil || took > 700*time.Millisecond {
			t.Errorf("%s while black-holed: %v after %v; want an error within the 200ms ctx", op.name, err, took)
		}
	}
	ps.Heal()
	if err := ls.Release(ctx); err != nil {
		t.Errorf("Release after the heal: %v", err)
	}
}
