package etcd_test

import (
	"context"
	"errors"
	"github.com/dlock/dlock/internal/testexport/etcdexport"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
)

// waitKeys waits until n keys are under prefix and returns them, oldest
// first.
func waitKeys(t *testing.T, ctx context.Context, raw *clientv3.Client, prefix string, n int) []*keyInfo {
	t.Helper()
	for {
		resp, err := raw.Get(ctx, prefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatalf("reading %q: %v", prefix, err)
		}
		if len(resp.Kvs) == n {
			keys := make([]*keyInfo, n)
			for i, kv := range resp.Kvs {
				keys[i] = &keyInfo{key: string(kv.Key), value: string(kv.Value), rev: kv.CreateRevision}
			}
			return keys
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%q never held %d keys (it holds %d)", prefix, n, len(resp.Kvs))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

type keyInfo struct {
	key, value string
	rev        int64
}

// acquireWith runs acquire in the background.
func acquireWith(ctx context.Context, acquire func(context.Context, *dlock.Options) (*dlock.Lease, error)) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		ls, err := acquire(ctx, nil)
		c <- acquired{ls, err}
	}()
	return c
}

// granted waits up to 5s for r's grant.
func granted(t *testing.T, what string, r <-chan acquired) *dlock.Lease {
	t.Helper()
	select {
	case a := <-r:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a.ls
	case <-time.After(5 * time.Second):
		t.Fatalf("%s not granted within 5s", what)
	}
	return nil
}

// waiting checks that none of rs has returned.
func waiting(t *testing.T, what string, rs ...<-chan acquired) {
	t.Helper()
	for _, r := range rs {
		select {
		case a := <-r:
			t.Fatalf("%s returned while it should wait (granted %v, error %v)", what, a.ls != nil, a.err)
		default:
		}
	}
}

func release(t *testing.T, ctx context.Context, ls *dlock.Lease) {
	t.Helper()
	if err := ls.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func fence(t *testing.T, ls *dlock.Lease) uint64 {
	t.Helper()
	f, ok := ls.Fence()
	if !ok {
		t.Fatal("no fencing token")
	}
	return f
}

// A lock, a semaphore and a read/write lock of one name are three objects,
// each in its namespace of the documented layout: a permit's key carries
// the limit, its fence is the key's create revision; a reader's key is under
// "read/", a writer's under "write/" with its create revision as fence.
// Names lists the lock only.
func TestKindsLayout(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	name := "x/y"
	lock, err := l.TryAcquire(ctx, name, &dlock.Options{Metadata: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, ctx, lock)
	sem, err := l.Semaphore(name, 2)
	if err != nil {
		t.Fatal(err)
	}
	permit, err := sem.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("a permit beside a lock of the same name: %v", err)
	}
	rw, err := l.RWLock(name)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := rw.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("a reader beside a lock and a permit of the same name: %v", err)
	}

	keys := waitKeys(t, ctx, raw, prefix+"%semaphore/x%2Fy/", 1)
	if want := prefix + "%semaphore/x%2Fy/" + permit.Token(); keys[0].key != want || keys[0].value != "2" {
		t.Errorf("permit key %q = %q; want %q = \"2\"", keys[0].key, keys[0].value, want)
	}
	if f := fence(t, permit); f != uint64(keys[0].rev) {
		t.Errorf("permit fence %d; want its key's create revision %d", f, keys[0].rev)
	}
	rwPrefix := etcd.RWMutexName(prefix, name) + "/"
	if rwPrefix != prefix+"%rwlock/x%2Fy/" {
		t.Errorf("RWMutexName = %q", rwPrefix)
	}
	keys = waitKeys(t, ctx, raw, rwPrefix, 1)
	if want := rwPrefix + "read/" + reader.Token(); keys[0].key != want {
		t.Errorf("reader key %q; want %q", keys[0].key, want)
	}
	if _, ok := reader.Fence(); ok {
		t.Error("a reader has a fencing token")
	}
	names, err := l.InspectPrefix(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0].Name != name || names[0].Metadata != "m" {
		t.Errorf("InspectPrefix = %+v; want the lock %q alone", names, name)
	}
	release(t, ctx, reader)
	writer, err := rw.TryLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys = waitKeys(t, ctx, raw, rwPrefix, 1)
	if want := rwPrefix + "write/" + writer.Token(); keys[0].key != want {
		t.Errorf("writer key %q; want %q", keys[0].key, want)
	}
	if f := fence(t, writer); f != uint64(keys[0].rev) {
		t.Errorf("writer fence %d; want its key's create revision %d", f, keys[0].rev)
	}
	release(t, ctx, writer)
	release(t, ctx, permit)
}

// Permits go to waiters in arrival order, whichever holder releases, and a
// waiter that gives up moves those behind it forward: limit 2, holders h1
// h2, waiters w1 w2 w3. h2's release grants w1 alone; w2 gives up, which
// grants nobody (h1 and w1 hold); h1's release grants w3. Fences follow
// the grants.
func TestSemaphoreQueue(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "queue"
	semPrefix := etcdexport.SemaphorePrefix(prefix, name)
	var sems []*dlock.Semaphore
	for range 5 {
		l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
		s, err := l.Semaphore(name, 2)
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	h1, err := sems[0].TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := sems[1].TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sems[2].TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a third permit: %v; want ErrNotAcquired", err)
	}
	w1 := acquireWith(ctx, sems[2].Acquire)
	waitKeys(t, ctx, raw, semPrefix, 3)
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	w2 := acquireWith(ctx2, sems[3].Acquire)
	waitKeys(t, ctx, raw, semPrefix, 4)
	w3 := acquireWith(ctx, sems[4].Acquire)
	waitKeys(t, ctx, raw, semPrefix, 5)

	release(t, ctx, h2)
	l1 := granted(t, "w1 after h2's release", w1)
	time.Sleep(100 * time.Millisecond) // a wrong grant would come by now
	waiting(t, "w2 or w3 beside h1 and w1", w2, w3)

	cancel2()
	if r := <-w2; !errors.Is(r.err, dlock.ErrNotAcquired) {
		t.Fatalf("w2 gave up: %v; want ErrNotAcquired", r.err)
	}
	waitKeys(t, ctx, raw, semPrefix, 3)
	time.Sleep(100 * time.Millisecond)
	waiting(t, "w3 beside h1 and w1", w3)

	release(t, ctx, h1)
	l3 := granted(t, "w3 after h1's release", w3)
	if f1, f2, f3 := fence(t, l1), fence(t, h2), fence(t, l3); f1 <= f2 || f3 <= f1 {
		t.Errorf("fences h2 %d, w1 %d, w3 %d: not in grant order", f2, f1, f3)
	}
	release(t, ctx, l1)
	release(t, ctx, l3)
}

// A permit's waiter whose semaphore changes between its read and its watch
// misses nothing: a release in that gap grants it, also when the revisions
// since its read are compacted away before its watch starts (it reads
// again).
func TestSemaphoreReleaseBeforeWatch(t *testing.T) {
	for _, compact := range []bool{false, true} {
		t.Run(map[bool]string{false: "release", true: "release and compaction"}[compact], func(t *testing.T) {
			srv, _ := etcdServer(t)
			ctx := testCtx(t)
			raw := newClient(t, srv.Addr())
			prefix := testPrefix(t, raw, 0)
			name := "gap"
			a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
			b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
			semA, _ := a.Semaphore(name, 1)
			semB, _ := b.Semaphore(name, 1)
			held, err := semA.TryAcquire(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var once atomic.Bool
			var compacted atomic.Int32
			restore := etcdexport.SetHooks(func(string) {
				if !once.CompareAndSwap(false, true) {
					return
				}
				if err := held.Release(context.Background()); err != nil {
					t.Errorf("Release in the gap: %v", err)
				}
				if !compact {
					return
				}
				resp, err := raw.Put(ctx, prefix+"filler", "x")
				if err == nil {
					_, err = raw.Delete(ctx, prefix+"filler")
				}
				if err == nil {
					_, err = raw.Compact(ctx, resp.Header.Revision+1, clientv3.WithCompactPhysical())
				}
				if err != nil {
					t.Errorf("compacting: %v", err)
				}
			}, func(wr clientv3.WatchResponse) {
				if wr.CompactRevision != 0 {
					compacted.Add(1)
				}
			})
			defer restore()
			ls := granted(t, "the waiter", acquireWith(ctx, semB.Acquire))
			if !once.Load() {
				t.Fatal("the hook did not run: the waiter did not wait")
			}
			if compact && compacted.Load() == 0 {
				t.Error("the waiter's watch did not meet the compaction")
			}
			release(t, ctx, ls)
		})
	}
}

// An acquisition under another limit than the keys under the semaphore
// fails at once with ErrLimitMismatch and leaves no key, also when the
// semaphore is full and a waiter queues under the holders' limit.
func TestSemaphoreLimitMismatchLeavesNoKey(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "mismatch"
	semPrefix := etcdexport.SemaphorePrefix(prefix, name)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	one, _ := a.Semaphore(name, 1)
	two, _ := b.Semaphore(name, 2)
	held, err := one.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireWith(ctx, one.Acquire)
	waitKeys(t, ctx, raw, semPrefix, 2)
	for _, try := range []bool{true, false} {
		acquire := two.Acquire
		if try {
			acquire = two.TryAcquire
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ls, err := acquire(actx, nil)
		cancel()
		if !errors.Is(err, dlock.ErrLimitMismatch) || ls != nil {
			t.Fatalf("try %v under limit 2 beside limit 1: %v, %v; want ErrLimitMismatch", try, ls, err)
		}
		if !strings.Contains(err.Error(), "limit 1") {
			t.Errorf("the error does not name the holders' limit: %v", err)
		}
		if keys := waitKeys(t, ctx, raw, semPrefix, 2); keys[0].value != "1" || keys[1].value != "1" {
			t.Fatalf("keys %+v, %+v; want the two of limit 1", *keys[0], *keys[1])
		}
	}
	release(t, ctx, held)
	release(t, ctx, granted(t, "the waiter under limit 1", w))
	ls, err := two.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("limit 2 once the semaphore is empty: %v", err)
	}
	release(t, ctx, ls)
}

// The read/write lock queues by create revision: a writer waits behind a
// reader, a reader that comes after the waiting writer waits behind it
// (TryRLock fails), the reader's release grants the writer alone, and the
// writer's release grants the reader. A second writer queued behind the
// reader that waits gets in after it.
func TestRWLockQueue(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "rw"
	rwPrefix := etcd.RWMutexName(prefix, name) + "/"
	var rws []*dlock.RWLock
	for range 4 {
		l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
		rw, err := l.RWLock(name)
		if err != nil {
			t.Fatal(err)
		}
		rws = append(rws, rw)
	}
	r1, err := rws[0].RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w1 := acquireWith(ctx, rws[1].Lock)
	waitKeys(t, ctx, raw, rwPrefix, 2)
	if ls, err := rws[2].TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock behind a waiting writer: %v, %v; want ErrNotAcquired", ls, err)
	}
	r2 := acquireWith(ctx, rws[2].RLock)
	waitKeys(t, ctx, raw, rwPrefix, 3)
	w2 := acquireWith(ctx, rws[3].Lock)
	keys := waitKeys(t, ctx, raw, rwPrefix, 4)
	for i, kind := range []string{"read/", "write/", "read/", "write/"} {
		if !strings.HasPrefix(keys[i].key, rwPrefix+kind) {
			t.Fatalf("key %d is %q; want under %q", i, keys[i].key, rwPrefix+kind)
		}
	}
	time.Sleep(100 * time.Millisecond)
	waiting(t, "a writer or a reader behind the reader", w1, r2, w2)

	release(t, ctx, r1)
	l1 := granted(t, "the first writer after the reader's release", w1)
	if f := fence(t, l1); f != uint64(keys[1].rev) {
		t.Errorf("writer fence %d; want its key's create revision %d", f, keys[1].rev)
	}
	time.Sleep(100 * time.Millisecond)
	waiting(t, "the reader or writer behind a writer", r2, w2)

	release(t, ctx, l1)
	lr := granted(t, "the reader after the writer's release", r2)
	time.Sleep(100 * time.Millisecond)
	waiting(t, "the second writer beside a reader", w2)
	release(t, ctx, lr)
	l2 := granted(t, "the second writer", w2)
	if f1, f2 := fence(t, l1), fence(t, l2); f2 <= f1 {
		t.Errorf("writers' fences %d then %d: not increasing", f1, f2)
	}
	release(t, ctx, l2)
}

// Readers share, and the writer is kept out of readers who came before it
// only: with readers r1 r2 holding and a writer waiting, releasing r2 (the
// nearest key the writer waits on) does not grant it; releasing r1 does.
func TestRWLockWriterWaitsForEveryOlderReader(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "readers"
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	rwA, _ := a.RWLock(name)
	rwB, _ := b.RWLock(name)
	r1, err := rwA.RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rwA.TryRLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireWith(ctx, rwB.Lock)
	waitKeys(t, ctx, raw, etcd.RWMutexName(prefix, name)+"/", 3)
	release(t, ctx, r2)
	time.Sleep(100 * time.Millisecond)
	waiting(t, "the writer beside r1", w)
	if ok, err := r1.Held(ctx); !ok || err != nil {
		t.Fatalf("r1: Held = %v, %v", ok, err)
	}
	release(t, ctx, r1)
	release(t, ctx, granted(t, "the writer", w))
}

// dlock's read/write lock and recipe.RWMutex on RWMutexName exclude each
// other: a recipe writer keeps dlock's readers and writers out, and a
// recipe writer waits for dlock's reader; readers of both share.
func TestRWLockRecipeInterop(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "recipe"
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	rw, _ := l.RWLock(name)
	m := recipe.NewRWMutex(newSession(t, srv.Addr()), etcd.RWMutexName(prefix, name))
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	if ls, err := rw.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock beside the recipe's writer: %v, %v", ls, err)
	}
	if ls, err := rw.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside the recipe's writer: %v, %v", ls, err)
	}
	r := acquireWith(ctx, rw.RLock)
	waitKeys(t, ctx, raw, etcd.RWMutexName(prefix, name)+"/", 2)
	if err := m.Unlock(); err != nil {
		t.Fatal(err)
	}
	reader := granted(t, "dlock's reader after the recipe's writer", r)
	m2 := recipe.NewRWMutex(newSession(t, srv.Addr()), etcd.RWMutexName(prefix, name))
	if err := m2.RLock(); err != nil { // shares with dlock's reader
		t.Fatal(err)
	}
	if err := m2.RUnlock(); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() { locked <- m.Lock() }()
	waitKeys(t, ctx, raw, etcd.RWMutexName(prefix, name)+"/", 2)
	select {
	case err := <-locked:
		t.Fatalf("the recipe's writer got in beside dlock's reader: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	release(t, ctx, reader)
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the recipe's writer not granted within 5s of dlock's reader's release")
	}
	if err := m.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// Leader election is concurrency.Election's layout on MutexName: dlock's
// Leader names an etcd Election's leader with its term (the key's create
// revision), a dlock candidate waits for it, and the etcd Election sees the
// dlock leader's candidate id.
func TestElectionInterop(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "election"
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	e := concurrency.NewElection(newSession(t, srv.Addr()), etcd.MutexName(prefix, name))
	if err := e.Campaign(ctx, "etcd-candidate"); err != nil {
		t.Fatal(err)
	}
	ld, err := l.Leader(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !ld.Held || ld.Candidate != "etcd-candidate" || ld.Term != uint64(e.Rev()) {
		t.Fatalf("Leader = %+v; want etcd-candidate with term %d", ld, e.Rev())
	}
	elected := acquireWith(ctx, func(ctx context.Context, _ *dlock.Options) (*dlock.Lease, error) {
		return l.Elect(ctx, name, "dlock-candidate", nil)
	})
	waitQueue(t, ctx, raw, prefix, name, 2)
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lead := granted(t, "dlock's candidate after the etcd leader resigned", elected)
	if term := fence(t, lead); term <= uint64(e.Rev()) {
		t.Errorf("dlock's term %d is not above the etcd leader's %d", term, e.Rev())
	}
	resp, err := concurrency.NewElection(newSession(t, srv.Addr()), etcd.MutexName(prefix, name)).Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(resp.Kvs[0].Value); got != "dlock-candidate" {
		t.Errorf("etcd Election.Leader = %q; want dlock-candidate", got)
	}
	release(t, ctx, lead)
	ld, err = l.Leader(ctx, name)
	if err != nil || ld.Held {
		t.Fatalf("Leader after resigning: %+v, %v", ld, err)
	}
}

// Observe hears a leader's resignation when it happens (the driver is a
// Notifier): the next leader is reported well within the old one's TTL.
func TestObserveHearsResignation(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	name := "observe"
	ttl := &dlock.Options{TTL: 10 * time.Second}
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	o := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	la, err := a.Elect(ctx, name, "a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := o.Observe(octx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ld := <-c; ld.Candidate != "a" {
		t.Fatalf("Observe first said %+v; want a", ld)
	}
	elected := acquireWith(ctx, func(ctx context.Context, _ *dlock.Options) (*dlock.Lease, error) {
		return b.Elect(ctx, name, "b", ttl)
	})
	waitQueue(t, ctx, raw, prefix, name, 2)
	start := time.Now()
	release(t, ctx, la)
	select {
	case ld := <-c:
		if ld.Candidate != "b" {
			t.Fatalf("Observe said %+v after a resigned; want b", ld)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Observe reported b %v after a resigned", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe did not report b within 5s of a's resignation (TTL 10s)")
	}
	release(t, ctx, granted(t, "b", elected))
	cancel()
	for range c {
	}
}
