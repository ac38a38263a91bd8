package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// kindsSetup returns a context, a raw client, a key prefix checked for
// residue at cleanup, and a Locker under that prefix.
func kindsSetup(t *testing.T) (context.Context, *goredis.Client, string, *dlock.Locker) {
	t.Helper()
	ctx := testCtx(t)
	raw := newClient(t, redisAddr(t))
	p := testPrefix(t, raw)
	return ctx, raw, p, newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
}

// waitExists waits until key exists (n true) or not.
func waitExists(t *testing.T, raw *goredis.Client, key string, want bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := raw.Exists(context.Background(), key).Result()
		if err != nil {
			t.Fatalf("EXISTS %s: %v", key, err)
		}
		if (n == 1) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s exists: %v, want %v", key, n == 1, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The default layout declares semaphores with fencing and read/write locks;
// the compat layout declares neither.
func TestKindCapabilities(t *testing.T) {
	l := newLocker(t, newClient(t, redisAddr(t)), nil)
	if c := l.Capabilities(); !c.Semaphore || !c.PermitFencing || !c.RWLock {
		t.Errorf("default layout: Semaphore %v, PermitFencing %v, RWLock %v; want all true", c.Semaphore, c.PermitFencing, c.RWLock)
	}
	lc := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{Compat: true})
	if c := lc.Capabilities(); c.Semaphore || c.PermitFencing || c.RWLock || c.Metadata {
		t.Errorf("compat layout declares new kinds: %+v", c)
	}
	if _, err := lc.Semaphore("s", 2); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("compat Semaphore: got %v, want ErrUnsupported", err)
	}
}

// A semaphore's layout: its holders in P{N}:permits scored by expiry, the
// limit in P{N}:permits:limit, both expiring, a counter P{N}:permits:fence
// whose value is the last grant's fence; all in one slot; after the last
// release only the counter is left (testPrefix checks).
func TestSemaphoreLayout(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	s, err := l.Semaphore("pool", 3)
	if err != nil {
		t.Fatal(err)
	}
	o := &dlock.Options{TTL: 5 * time.Second}
	var leases []*dlock.Lease
	var last uint64
	for i := range 3 {
		ls, err := s.TryAcquire(ctx, o)
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		f, ok := ls.Fence()
		if !ok || f <= last {
			t.Errorf("permit %d: fence %d, %v; want above %d", i, f, ok, last)
		}
		last = f
		leases = append(leases, ls)
	}
	if _, err := s.TryAcquire(ctx, o); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("4th permit of 3: got %v, want ErrNotAcquired", err)
	}
	holders, limit, fence := p+"{pool}:permits", p+"{pool}:permits:limit", p+"{pool}:permits:fence"
	if n, err := raw.ZCard(ctx, holders).Result(); err != nil || n != 3 {
		t.Errorf("ZCARD %s = %d, %v; want 3", holders, n, err)
	}
	if got, err := raw.ZScore(ctx, holders, leases[0].Token()).Result(); err != nil || got < float64(time.Now().Add(4*time.Second).UnixMilli()) {
		t.Errorf("ZSCORE %s = %v, %v; want an expiry about 5s ahead", holders, got, err)
	}
	if got, err := raw.Get(ctx, limit).Result(); err != nil || got != "3" {
		t.Errorf("GET %s = %q, %v; want 3", limit, got, err)
	}
	for _, k := range []string{holders, limit} {
		if pttl, err := raw.PTTL(ctx, k).Result(); err != nil || pttl <= 4*time.Second || pttl > 5*time.Second {
			t.Errorf("PTTL %s = %v, %v; want in (4s, 5s]", k, pttl, err)
		}
	}
	if got, err := raw.Get(ctx, fence).Uint64(); err != nil || got != last {
		t.Errorf("GET %s = %d, %v; want the last fence %d", fence, got, err, last)
	}
	slot := raw.ClusterKeySlot(ctx, p+"{pool}").Val()
	for _, k := range []string{holders, limit, fence} {
		if got := raw.ClusterKeySlot(ctx, k).Val(); got != slot {
			t.Errorf("%s hashes to slot %d, the lock's name to %d", k, got, slot)
		}
	}
	for _, ls := range leases {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{holders, limit} {
		if n, _ := raw.Exists(ctx, k).Result(); n != 0 {
			t.Errorf("%s still exists after the last release", k)
		}
	}
}

// A permit asked for under another limit than the holders' is refused with
// ErrLimitMismatch (naming both limits), by TryAcquire and by a waiting
// Acquire alike, and nothing is taken; once the holders are gone the new
// limit is the semaphore's.
func TestSemaphoreLimitMismatch(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	s3, _ := l.Semaphore("pool", 3)
	s2, _ := l.Semaphore("pool", 2)
	ls, err := s3.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("TryAcquire under limit 2: got %v, want ErrLimitMismatch", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s2.Acquire(wctx, nil); !errors.Is(err, dlock.ErrLimitMismatch) || wctx.Err() != nil {
		t.Errorf("Acquire under limit 2: got %v, want ErrLimitMismatch at once", err)
	}
	if n, _ := raw.ZCard(ctx, p+"{pool}:permits").Result(); n != 1 {
		t.Errorf("%d holders after the refusals, want 1", n)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ls2, err := s2.TryAcquire(ctx, nil)
	if err != nil {
		t.Fatalf("limit 2 once nobody holds: %v", err)
	}
	if _, err := s3.TryAcquire(ctx, nil); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Errorf("limit 3 under holders of 2: got %v, want ErrLimitMismatch", err)
	}
	if err := ls2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter for a permit is woken by a release (a message on the
// semaphore's channel), long before the holder's TTL.
func TestSemaphoreNotifiedOnRelease(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	s, _ := l.Semaphore("pool", 1)
	ls, err := s.TryAcquire(ctx, &dlock.Options{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l2 := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	s2, _ := l2.Semaphore("pool", 1)
	got := make(chan result, 1)
	go func() {
		ls, err := s2.Acquire(ctx, nil)
		got <- result{ls, err, time.Now()}
	}()
	waitSubscribers(t, raw, p+"{pool}:permits:released", 1)
	released := time.Now()
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if d := r.at.Sub(released); d > 5*time.Second {
		t.Errorf("waiter granted %v after the release; want at once (the holder's TTL was 20s)", d)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A crashed holder's permit (an entry nobody refreshes) comes back at its
// expiry: a waiter gets it then, and the stale entry is gone.
func TestSemaphoreCrashedHolderExpires(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	s, _ := l.Semaphore("pool", 1)
	crashed, err := s.TryAcquire(ctx, &dlock.Options{TTL: 300 * time.Millisecond, NoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ls, err := s.Acquire(ctx, &dlock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("granted after %v; want at the crashed holder's expiry (300ms)", d)
	}
	<-crashed.Done()
	if n, _ := raw.ZScore(ctx, p+"{pool}:permits", crashed.Token()).Result(); n != 0 {
		t.Errorf("the expired permit is still in the set")
	}
	if err := crashed.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLost) {
		t.Errorf("releasing the expired permit: got %v, want ErrNotHeld or ErrLost", err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// At most Limit permits are held at any time, across Lockers waiting for
// them concurrently; every permit's fence is above every earlier one of
// the semaphore; nothing is left behind.
func TestSemaphoreBound(t *testing.T) {
	ctx, _, p, _ := kindsSetup(t)
	const limit, workers, rounds = 2, 6, 15
	var held, peak atomic.Int32
	var mu sync.Mutex
	fences := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
		s, _ := l.Semaphore("pool", limit)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ls, err := s.Acquire(ctx, &dlock.Options{TTL: 5 * time.Second})
				if err != nil {
					errs <- err
					return
				}
				n := held.Add(1)
				for {
					m := peak.Load()
					if n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				f, _ := ls.Fence()
				mu.Lock()
				dup := fences[f]
				fences[f] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("fence %d granted twice", f)
				}
				time.Sleep(time.Millisecond)
				held.Add(-1)
				if err := ls.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := peak.Load(); m > limit {
		t.Errorf("%d permits held at once, limit %d", m, limit)
	}
}

// A writer that waits keeps new readers out while readers already holding
// keep the lock; it is granted once they release; readers get in again
// once it releases. Its wait lives in P{N}:rw:waits while it waits.
func TestRWLockWriterPreference(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	rw, err := l.RWLock("doc")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := rw.RLock(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, err := rw.TryLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock beside readers: got %v, want ErrNotAcquired", err)
	}
	// A TryLock registers no wait: readers still get in.
	r3, err := rw.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("reader after a TryLock: %v", err)
	}
	if err := r3.Release(ctx); err != nil {
		t.Fatal(err)
	}

	l2 := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	rw2, _ := l2.RWLock("doc")
	got := make(chan result, 1)
	go func() {
		ls, err := rw2.Lock(ctx, nil)
		got <- result{ls, err, time.Now()}
	}()
	waits := p + "{doc}:rw:waits"
	waitExists(t, raw, waits, true)
	if _, err := rw.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("new reader while a writer waits: got %v, want ErrNotAcquired", err)
	}
	if err := r1.Refresh(ctx, 0); err != nil {
		t.Errorf("a reader holding keeps the lock: Refresh: %v", err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("writer granted beside a reader: %v", r.err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("writer: %v", r.err)
	}
	if _, ok := r.ls.Fence(); !ok {
		t.Error("the writer's lease has no fence")
	}
	if n, _ := raw.Exists(ctx, waits).Result(); n != 0 {
		t.Errorf("%s left after the writer's grant", waits)
	}
	if _, err := rw.TryRLock(ctx, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("reader beside the writer: got %v, want ErrNotAcquired", err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r4, err := rw.TryRLock(ctx, nil)
	if err != nil {
		t.Fatalf("reader after the writer released: %v", err)
	}
	if err := r4.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A writer that gives up waiting removes its wait at once: readers kept
// out are woken and get in, and nothing is left.
func TestRWLockWriterGivesUp(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	rw, _ := l.RWLock("doc")
	r1, err := rw.RLock(ctx, &dlock.Options{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l2 := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	rw2, _ := l2.RWLock("doc")
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan result, 1)
	go func() {
		ls, err := rw2.Lock(wctx, nil)
		got <- result{ls, err, time.Now()}
	}()
	waits := p + "{doc}:rw:waits"
	waitExists(t, raw, waits, true)
	reader := make(chan result, 1)
	go func() {
		ls, err := rw.RLock(ctx, nil)
		reader <- result{ls, err, time.Now()}
	}()
	waitSubscribers(t, raw, p+"{doc}:rw:released", 2)
	cancel()
	if r := <-got; !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled writer: got %v, want ErrNotAcquired and Canceled", r.err)
	}
	if n, _ := raw.Exists(ctx, waits).Result(); n != 0 {
		t.Errorf("%s left after the writer gave up", waits)
	}
	r := <-reader
	if r.err != nil {
		t.Fatalf("reader kept out: %v", r.err)
	}
	if d := time.Since(r.at); d > 5*time.Second {
		t.Errorf("reader granted late")
	}
	for _, ls := range []*dlock.Lease{r1, r.ls} {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Never a writer beside a reader or another writer, with Lockers reading
// and writing concurrently; writers' fences strictly increase.
func TestRWLockExclusion(t *testing.T) {
	ctx, _, p, _ := kindsSetup(t)
	const workers, rounds = 6, 12
	var readers, writers atomic.Int32
	var mu sync.Mutex
	var lastFence uint64
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for i := range workers {
		l := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
		rw, _ := l.RWLock("doc")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				write := (i+j)%3 == 0
				var ls *dlock.Lease
				var err error
				if write {
					ls, err = rw.Lock(ctx, nil)
				} else {
					ls, err = rw.RLock(ctx, nil)
				}
				if err != nil {
					errs <- err
					return
				}
				if write {
					if w := writers.Add(1); w != 1 || readers.Load() != 0 {
						errs <- fmt.Errorf("writer beside %d writers and %d readers", w-1, readers.Load())
					}
					f, _ := ls.Fence()
					mu.Lock()
					if f <= lastFence {
						errs <- fmt.Errorf("writer's fence %d after %d", f, lastFence)
					}
					lastFence = f
					mu.Unlock()
				} else if readers.Add(1); writers.Load() != 0 {
					errs <- fmt.Errorf("reader beside a writer")
				}
				time.Sleep(time.Millisecond)
				if write {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
				if err := ls.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
