package zookeeper_test

import (
	"context"
	"errors"
	"github.com/dlock/dlock/internal/testexport/zookeeperexport"
	"github.com/dlock/dlock/tests/internal/testutil"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// waitChildren waits until the znode at parent has n children, and returns
// them.
func waitChildren(t *testing.T, raw *zk.Conn, parent string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		children, _, err := raw.Children(parent)
		if err == nil && len(children) == n || n == 0 && errors.Is(err, zk.ErrNoNode) {
			return children
		}
		if time.Now().After(deadline) {
			t.Fatalf("children of %s: got %v (%v), want %d", parent, children, err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// permitAsync waits for a permit of sem in the background.
func permitAsync(ctx context.Context, sem *dlock.Semaphore) <-chan result {
	c := make(chan result, 1)
	go func() {
		ls, err := sem.Acquire(ctx, nil)
		c <- result{ls, err}
	}()
	return c
}

func semaphore(t *testing.T, l *dlock.Locker, name string, limit int) *dlock.Semaphore {
	t.Helper()
	sem, err := l.Semaphore(name, limit)
	if err != nil {
		t.Fatal(err)
	}
	return sem
}

// TestSemaphoreWaiterAheadLeaves: limit 2, two holders, two waiters; the
// first waiter gives up, then a holder releases: the second waiter, which
// watched the first, is granted the permit. A waiter that watched only the
// node limit places ahead of it (the first holder) would sleep on.
func TestSemaphoreWaiterAheadLeaves(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "sem-leave-" + testutil.RandomHex(4)
	parent := zookeeper.SemaphorePath("", name)
	var sems []*dlock.Semaphore
	for range 4 {
		sems = append(sems, semaphore(t, connect(t, srv.Addr(), withTTL(time.Second)), name, 2))
	}
	h0, err := sems[0].Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	h1, err := sems[1].Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, giveUp := context.WithCancel(ctx)
	first := permitAsync(wctx, sems[2])
	waitChildren(t, raw, parent, 3)
	second := permitAsync(ctx, sems[3])
	waitChildren(t, raw, parent, 4)
	giveUp()
	if r := <-first; !errors.Is(r.err, dlock.ErrNotAcquired) {
		t.Fatalf("the first waiter, cancelled: %v, want ErrNotAcquired", r.err)
	}
	waitChildren(t, raw, parent, 3)
	notGranted(t, second, "the second waiter, with two permits held")
	release(t, h0)
	ls := granted(t, second, 10*time.Second, "the second waiter, after a release")
	release(t, ls)
	release(t, h1)
	waitChildren(t, raw, parent, 0)
}

// TestSemaphoreGrantWakesNext: limit 2, two holders, two waiters. A release
// grants the first waiter; the second now waits first in line, and the next
// release grants it while the first still holds. The second waiter watched
// the first, which stays: the first's grant writes its node's data to wake
// it.
func TestSemaphoreGrantWakesNext(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "sem-next-" + testutil.RandomHex(4)
	parent := zookeeper.SemaphorePath("", name)
	var sems []*dlock.Semaphore
	for range 4 {
		sems = append(sems, semaphore(t, connect(t, srv.Addr(), withTTL(time.Second)), name, 2))
	}
	h0, err := sems[0].Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	h1, err := sems[1].Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := permitAsync(ctx, sems[2])
	waitChildren(t, raw, parent, 3)
	second := permitAsync(ctx, sems[3])
	waitChildren(t, raw, parent, 4)
	release(t, h0)
	w0 := granted(t, first, 10*time.Second, "the first waiter, after a release")
	notGranted(t, second, "the second waiter, with two permits held")
	release(t, h1)
	w1 := granted(t, second, 10*time.Second, "the second waiter, after the second release")
	if held, err := w0.Held(ctx); err != nil || !held {
		t.Fatalf("the first waiter's permit: Held() = %v, %v; want true", held, err)
	}
	release(t, w0) // deleted with the version its grant's write left
	release(t, w1)
	waitChildren(t, raw, parent, 0)
}

// TestSemaphoreMismatchWaiting: an Acquire under another limit than the
// holders' fails at once with ErrLimitMismatch, rather than waiting, and
// leaves no node; so does a TryAcquire. A holder or waiter behind it with
// the holders' limit is not refused.
func TestSemaphoreMismatchWaiting(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "sem-mismatch-" + testutil.RandomHex(4)
	parent := zookeeper.SemaphorePath("", name)
	l := connect(t, srv.Addr(), withTTL(time.Second))
	h, err := semaphore(t, l, name, 1).Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := permitAsync(ctx, semaphore(t, l, name, 1))
	waitChildren(t, raw, parent, 2)
	_, err = semaphore(t, l, name, 3).Acquire(ctx, nil)
	if !errors.Is(err, dlock.ErrLimitMismatch) || !strings.Contains(err.Error(), "limit 1") {
		t.Fatalf("Acquire with limit 3: %v, want ErrLimitMismatch naming limit 1", err)
	}
	_, err = semaphore(t, l, name, 2).TryAcquire(ctx, nil)
	if !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("TryAcquire with limit 2: %v, want ErrLimitMismatch", err)
	}
	waitChildren(t, raw, parent, 2)
	notGranted(t, w, "the waiter with the holder's limit")
	release(t, h)
	release(t, granted(t, w, 10*time.Second, "the waiter with the holder's limit"))
	waitChildren(t, raw, parent, 0)
}

// TestRWLockCuratorLayout: read and write nodes are named as Apache
// Curator's InterProcessReadWriteLock names them, under RWLockPath: a
// Curator-style write node keeps dlock's readers and writers out, a
// Curator-style read node lets dlock's readers in and keeps its writers
// out, and dlock's nodes are named __READ__ and __WRIT__.
func TestRWLockCuratorLayout(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "rw-curator-" + testutil.RandomHex(4)
	parent := zookeeper.RWLockPath("", name)
	l := connect(t, srv.Addr(), withTTL(time.Second))
	rw, err := l.RWLock(name)
	if err != nil {
		t.Fatal(err)
	}
	// Curator creates the parents as persistent (or container) nodes.
	for _, p := range []string{"/dlock", "/dlock/%rwlocks", parent} {
		if _, err := raw.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = raw.Delete(parent, -1) })
	curator := func(lockName string) string {
		t.Helper()
		p, err := raw.Create(parent+"/_c_6f1c2a34-51b1-4c1e-9d0e-"+testutil.RandomHex(6)+"-"+lockName, nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	w := curator("__WRIT__")
	if _, err := rw.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock beside a Curator writer: %v, want ErrNotAcquired", err)
	}
	if _, err := rw.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside a Curator writer: %v, want ErrNotAcquired", err)
	}
	if err := raw.Delete(w, -1); err != nil {
		t.Fatal(err)
	}

	r := curator("__READ__")
	ls, err := rw.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("TryRLock beside a Curator reader: %v", err)
	}
	children := waitChildren(t, raw, parent, 2)
	if !strings.Contains(strings.Join(children, " "), "_c_"+ls.Token()+"-__READ__") {
		t.Errorf("nodes %v: want dlock's reader as _c_<token>-__READ__<seq>", children)
	}
	if _, err := rw.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside a Curator reader: %v, want ErrNotAcquired", err)
	}
	release(t, ls)
	if err := raw.Delete(r, -1); err != nil {
		t.Fatal(err)
	}
	ls, err = rw.TryLock(ctx, nil)
	if err != nil {
		t.Fatalf("TryLock on a free lock: %v", err)
	}
	children = waitChildren(t, raw, parent, 1)
	if want := "_c_" + ls.Token() + "-__WRIT__"; !strings.HasPrefix(children[0], want) {
		t.Errorf("node %v: want dlock's writer as %s<seq>", children, want)
	}
	release(t, ls)
}

// TestRWLockWriterFencing: a writer's fencing token is its write node's
// czxid, and it increases from one writer to the next, across readers
// granted in between.
func TestRWLockWriterFencing(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "rw-fence-" + testutil.RandomHex(4)
	parent := zookeeper.RWLockPath("", name)
	l := connect(t, srv.Addr(), withTTL(time.Second))
	rw, err := l.RWLock(name)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 3 {
		r, err := rw.RLock(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.Fence(); ok {
			t.Errorf("a reader's lease has a fencing token")
		}
		release(t, r)
		w, err := rw.Lock(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		fence, ok := w.Fence()
		children := waitChildren(t, raw, parent, 1)
		_, st, err := raw.Get(parent + "/" + children[0])
		if err != nil {
			t.Fatal(err)
		}
		if !ok || fence != uint64(st.Czxid) || fence <= last {
			t.Fatalf("writer %d: Fence() = %d, %v; want the node's czxid %d, above %d", i, fence, ok, st.Czxid, last)
		}
		last = fence
		release(t, w)
	}
}

// TestElectionSinceIsGrant: a candidate that waited is reported leading
// since its grant, not since it joined the queue: its node's data is
// written again when it is granted, and Inspect reports the mtime.
func TestElectionSinceIsGrant(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	name := "elect-since-" + testutil.RandomHex(4)
	a := connect(t, srv.Addr(), withTTL(time.Second))
	b := connect(t, srv.Addr(), withTTL(time.Second))
	la, err := a.Elect(ctx, name, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := make(chan result, 1)
	go func() {
		ls, err := b.Elect(ctx, name, "b", nil)
		c <- result{ls, err}
	}()
	waitQueue(t, raw, name, 2)
	var queued time.Time
	for _, ch := range waitChildren(t, raw, zookeeper.LockPath("", name), 2) {
		data, st, err := raw.Get(zookeeper.LockPath("", name) + "/" + ch)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) == "b" {
			queued = time.UnixMilli(st.Ctime)
		}
	}
	// Let the server's millisecond clock move past b's joining.
	waitFor(t, time.Second, "time past b's queueing", func() bool { return time.Since(queued) > 20*time.Millisecond })
	released := time.Now().Truncate(time.Millisecond)
	release(t, la)
	lb := granted(t, c, 10*time.Second, "b")
	ld, err := b.Leader(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if term, _ := lb.Fence(); !ld.Held || ld.Candidate != "b" || ld.Term != term {
		t.Fatalf("Leader() = %+v, want b with term %d", ld, term)
	}
	// The server's clock is the host's (a container), to the millisecond.
	if ld.Since.Before(released.Add(-5*time.Millisecond)) || ld.Since.After(time.Now().Add(5*time.Millisecond)) {
		t.Errorf("Leader().Since = %v: b joined the queue at %v, was granted after %v", ld.Since, queued, released)
	}
	release(t, lb)
}

// TestKindsOwnNamespaces: a lock, a semaphore and a read/write lock of one
// name are independent, each under its own node; Inspect and InspectPrefix
// describe the lock only (the namespaces' nodes are no lock names).
func TestKindsOwnNamespaces(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	l := connect(t, srv.Addr(), withTTL(time.Second))
	name := "kinds-" + testutil.RandomHex(4)
	rw, err := l.RWLock(name)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rw.TryLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := semaphore(t, l, name, 1).TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("a semaphore beside a held write lock of its name: %v", err)
	}
	infos, err := l.InspectPrefix(ctx, name)
	if err != nil || len(infos) != 0 {
		t.Fatalf("InspectPrefix with a permit and a writer held: %+v, %v; want no lock", infos, err)
	}
	ls, err := l.TryAcquire(ctx, name, &dlock.Options{Metadata: "m"})
	if err != nil {
		t.Fatalf("a lock beside a semaphore and a read/write lock of its name: %v", err)
	}
	infos, err = l.InspectPrefix(ctx, name)
	if err != nil || len(infos) != 1 || infos[0].Name != name || infos[0].Metadata != "m" {
		t.Fatalf("InspectPrefix: %+v, %v; want the lock %q alone", infos, err, name)
	}
	for _, parent := range []string{zookeeper.LockPath("", name), zookeeper.SemaphorePath("", name), zookeeper.RWLockPath("", name)} {
		waitChildren(t, raw, parent, 1)
	}
	for _, ls := range []*dlock.Lease{w, p, ls} {
		release(t, ls)
	}
}

// TestOrphanLostCreateReplyKinds: TestOrphanLostCreateReply for a permit and
// for a writer. The reply to the create is lost (the connection is reset
// with it held up in the proxy); the attempt finds its node again by its
// GUID among the kind's nodes, waits with it, is granted, and leaves no
// other node.
func TestOrphanLostCreateReplyKinds(t *testing.T) {
	for _, kind := range []string{"permit", "write"} {
		t.Run(kind, func(t *testing.T) {
			srv, ctx, p := orphanSetup(t)
			l := connect(t, p.Addr(), withTTL(3*time.Second))
			holder := connect(t, srv.Addr(), withTTL(3*time.Second))
			raw := rawConn(t, srv.Addr(), 10*time.Second)
			name := "lostreply-" + kind + "-" + testutil.RandomHex(4)
			var (
				parent  string
				acquire func(ctx context.Context, l *dlock.Locker) (*dlock.Lease, error)
			)
			switch kind {
			case "permit":
				parent = zookeeper.SemaphorePath("", name)
				acquire = func(ctx context.Context, l *dlock.Locker) (*dlock.Lease, error) {
					return semaphore(t, l, name, 1).Acquire(ctx, nil)
				}
			case "write":
				parent = zookeeper.RWLockPath("", name)
				acquire = func(ctx context.Context, l *dlock.Locker) (*dlock.Lease, error) {
					rw, err := l.RWLock(name)
					if err != nil {
						return nil, err
					}
					return rw.Lock(ctx, nil)
				}
			}
			ls, err := acquire(ctx, l) // opens the session
			if err != nil {
				t.Fatal(err)
			}
			release(t, ls)
			lh, err := acquire(ctx, holder)
			if err != nil {
				t.Fatal(err)
			}

			p.SetLatency(500 * time.Millisecond)
			c := make(chan result, 1)
			go func() {
				ls, err := acquire(ctx, l)
				c <- result{ls, err}
			}()
			waitChildren(t, raw, parent, 2)
			p.Reset()
			p.SetLatency(0)
			notGranted(t, c, "waiter")
			release(t, lh)
			ls = granted(t, c, 15*time.Second, "the acquisition whose create's reply was lost")
			if children, _, err := raw.Children(parent); err != nil || len(children) != 1 {
				t.Errorf("nodes after the grant: %v (%v), want the lease's alone", children, err)
			}
			release(t, ls)
			waitChildren(t, raw, parent, 0)
		})
	}
}

// TestWatchShared: Watch (which Observe uses) fires when the holder
// releases, and watches of a name share one server watch until it fires
// (go-zookeeper cannot remove a watch: an observer looking again every
// second would otherwise pile them up under a long-lived leader).
func TestWatchShared(t *testing.T) {
	srv := zkServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, watch, shared, err := zookeeperexport.ConnectWithWatch(ctx, []string{srv.Addr()}, withTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	holder := connect(t, srv.Addr(), withTTL(time.Second))
	name := "watch-" + testutil.RandomHex(4)
	ls, err := holder.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c1, stop1, err := watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	w1 := shared(name)
	for range 50 {
		_, stop, err := watch(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		stop()
	}
	c2, stop2, err := watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if w2 := shared(name); w1 == nil || w2 != w1 {
		t.Fatalf("watches of one name: server watches %v then %v, want one shared", w1, w2)
	}
	stop1()
	release(t, ls)
	select {
	case <-c2:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not fire within 10s of the release")
	}
	select {
	case <-c1:
		t.Error("a stopped watch fired")
	default:
	}
	_, stop3, err := watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer stop3()
	if w3 := shared(name); w3 == nil || w3 == w1 {
		t.Errorf("after the watch fired: server watch %v, want a new one", w3)
	}
}

// TestChurn: lockers take permits (limit 3), or read and write locks,
// over and over, many of their waits cut short at random. Never more than
// 3 permits, never a writer beside anyone; nobody is left asleep when
// entitled (every locker is granted once more at the end, within a few
// seconds, with nothing else going on); no node is left.
//
// Every fourth wait of a locker is not cut short, and the churn goes on
// past its 3s until it has both grants and cuts to tell by: at load ~20
// on 2 cores a grant takes longer than the 1-30ms waits, and 3s of them
// gave 0-6 grants for 450-650 cuts.
func TestChurn(t *testing.T) {
	for _, kind := range []string{"permit", "rw"} {
		t.Run(kind, func(t *testing.T) {
			srv := zkServer(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			raw := rawConn(t, srv.Addr(), 10*time.Second)
			name := "churn-" + kind + "-" + testutil.RandomHex(4)
			parent := zookeeper.SemaphorePath("", name)
			if kind == "rw" {
				parent = zookeeper.RWLockPath("", name)
			}
			const lockers, limit = 6, 3
			var (
				mu             sync.Mutex
				permits, reads int
				writing        bool
				grants, cuts   atomic.Int64
			)
			enter := func(write bool) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case kind == "permit":
					if permits++; permits > limit {
						t.Errorf("%d permits held, limit %d", permits, limit)
					}
				case write:
					if writing || reads > 0 {
						t.Errorf("a writer granted beside a writer (%v) or %d readers", writing, reads)
					}
					writing = true
				default:
					if writing {
						t.Error("a reader granted beside a writer")
					}
					reads++
				}
			}
			leave := func(write bool) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case kind == "permit":
					permits--
				case write:
					writing = false
				default:
					reads--
				}
			}
			take := func(ctx context.Context, l *dlock.Locker, write bool) (*dlock.Lease, error) {
				if kind == "permit" {
					return semaphore(t, l, name, limit).Acquire(ctx, nil)
				}
				rw, err := l.RWLock(name)
				if err != nil {
					return nil, err
				}
				if write {
					return rw.Lock(ctx, nil)
				}
				return rw.RLock(ctx, nil)
			}
			ls := make([]*dlock.Locker, lockers)
			for i := range ls {
				ls[i] = connect(t, srv.Addr(), withTTL(2*time.Second))
			}
			var wg sync.WaitGroup
			stop := time.Now().Add(3 * time.Second)
			enough := stop.Add(20 * time.Second) // leaves the end its time
			churning := func() bool {
				now := time.Now()
				return now.Before(stop) || now.Before(enough) && (grants.Load() < lockers || cuts.Load() < lockers)
			}
			for i, l := range ls {
				wg.Go(func() {
					for n := 0; churning(); n++ {
						write := (i+n)%3 == 0
						wait := time.Duration(1+rand.IntN(30)) * time.Millisecond
						if n%4 == 3 {
							wait = 10 * time.Second
						}
						wctx, wcancel := context.WithTimeout(ctx, wait)
						lease, err := take(wctx, l, write)
						wcancel()
						if err != nil {
							if !errors.Is(err, dlock.ErrNotAcquired) {
								t.Errorf("locker %d: %v", i, err)
								return
							}
							cuts.Add(1)
							continue
						}
						grants.Add(1)
						enter(write)
						time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
						leave(write)
						if err := lease.Release(ctx); err != nil {
							t.Errorf("locker %d: Release: %v", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%d grants, %d waits cut short", grants.Load(), cuts.Load())
			if grants.Load() < lockers || cuts.Load() < lockers {
				t.Errorf("%d grants and %d waits cut short: too little churn to tell", grants.Load(), cuts.Load())
			}
			// Everyone at once, waiting as long as it takes a queue of six
			// to drain: a waiter left asleep would not be granted.
			for i, l := range ls {
				wg.Go(func() {
					wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
					defer wcancel()
					lease, err := take(wctx, l, i%2 == 0)
					if err != nil {
						t.Errorf("locker %d, at the end: %v", i, err)
						return
					}
					enter(i%2 == 0)
					time.Sleep(10 * time.Millisecond)
					leave(i%2 == 0)
					if err := lease.Release(ctx); err != nil {
						t.Errorf("locker %d: Release: %v", i, err)
					}
				})
			}
			wg.Wait()
			waitChildren(t, raw, parent, 0)
		})
	}
}
