package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/etcd"
	"github.com/dlock/dlock/tests/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// queueKeys reads the keys in name's queue.
func queueKeys(t *testing.T, ctx context.Context, raw *clientv3.Client, prefix, name string) *clientv3.GetResponse {
	t.Helper()
	resp, err := raw.Get(ctx, etcd.MutexName(prefix, name)+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("reading the keys of %q: %v", name, err)
	}
	return resp
}

// TryAcquireAll is one transaction: every name's key has the same create
// revision, which is each name's fence, on the Locker's shared etcd lease
// (or, with LeasePerLock, on one etcd lease each); the names are held
// until Release frees them all.
func TestTryAcquireAllOneTransaction(t *testing.T) {
	for _, perLock := range []bool{false, true} {
		t.Run(fmt.Sprintf("LeasePerLock=%v", perLock), func(t *testing.T) {
			srv, _ := etcdServer(t)
			ctx := testutil.Ctx(t)
			raw := newClient(t, srv.Addr())
			prefix := testPrefix(t, raw, 0)
			o := &etcd.Options{KeyPrefix: prefix, LeasePerLock: perLock}
			a := newLocker(t, newClient(t, srv.Addr()), o)
			b := newLocker(t, newClient(t, srv.Addr()), o)
			names := []string{"all/a", "all/b", "all/c"}
			ls, err := a.TryAcquireAll(ctx, names, nil)
			if err != nil {
				t.Fatalf("TryAcquireAll: %v", err)
			}
			fences, _ := ls.Fences()
			leases := make(map[int64]bool)
			for i, n := range names {
				kvs := queueKeys(t, ctx, raw, prefix, n).Kvs
				if len(kvs) != 1 {
					t.Fatalf("%d keys under %q; want 1", len(kvs), n)
				}
				if got := uint64(kvs[0].CreateRevision); got != fences[i] {
					t.Errorf("create revision of %q's key = %d; want its fence %d", n, got, fences[i])
				}
				leases[kvs[0].Lease] = true
				if _, err := b.TryAcquire(ctx, n, nil); !errors.Is(err, dlock.ErrNotAcquired) {
					t.Fatalf("TryAcquire(%q) while TryAcquireAll holds it: %v; want ErrNotAcquired", n, err)
				}
			}
			if fences[0] != fences[1] || fences[1] != fences[2] {
				t.Errorf("fences %v; want one revision for every name (one transaction)", fences)
			}
			want := 1
			if perLock {
				want = len(names)
			}
			if len(leases) != want {
				t.Errorf("the keys are on %d etcd leases; want %d", len(leases), want)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			for _, n := range names {
				if kvs := queueKeys(t, ctx, raw, prefix, n).Kvs; len(kvs) != 0 {
					t.Errorf("%d keys under %q after Release; want none", len(kvs), n)
				}
			}
		})
	}
}

// TryAcquireAll with one name held (by a concurrency.Mutex, whose key is
// not dlock's) fails with a *driver.BusyError naming that name, and puts
// no key under the others.
func TestTryAcquireAllNamesTheBusyName(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	names := []string{"busy/a", "busy/b", "busy/c"}
	m := concurrency.NewMutex(newSession(t, srv.Addr()), etcd.MutexName(prefix, names[1]))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquireAll(ctx, names, nil)
	var busy *driver.BusyError
	if !errors.As(err, &busy) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with %q held: %v; want a *driver.BusyError", names[1], err)
	}
	if !strings.Contains(err.Error(), etcd.MutexName(prefix, names[1])) {
		t.Errorf("TryAcquireAll's error %q does not name the busy %q", err, etcd.MutexName(prefix, names[1]))
	}
	for _, n := range []string{names[0], names[2]} {
		if kvs := queueKeys(t, ctx, raw, prefix, n).Kvs; len(kvs) != 0 {
			t.Errorf("%d keys under %q after TryAcquireAll failed; want none", len(kvs), n)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Up to etcd's default --max-txn-ops (128) names go in one transaction;
// more are taken one by one, each at a revision of its own.
func TestTryAcquireAllTxnLimit(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	for _, tc := range []struct {
		n   int
		one bool
	}{{128, true}, {129, false}} {
		names := make([]string, tc.n)
		for i := range names {
			names[i] = fmt.Sprintf("limit/%03d", i)
		}
		ls, err := l.TryAcquireAll(ctx, names, nil)
		if err != nil {
			t.Fatalf("TryAcquireAll of %d names: %v", tc.n, err)
		}
		fences, _ := ls.Fences()
		slices.Sort(fences)
		if one := fences[0] == fences[len(fences)-1]; one != tc.one {
			t.Errorf("TryAcquireAll of %d names in one transaction: %v; want %v (fences %d to %d)", tc.n, one, tc.one, fences[0], fences[len(fences)-1])
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatalf("Release of %d names: %v", tc.n, err)
		}
	}
}

// On a server whose --max-txn-ops is below a TryAcquireAll's names, the
// refused transaction sends the Locker to its one-by-one path: the names
// are granted, each at a revision of its own. Their Release, whose parts'
// transactions group into a request over the limit (nested ones count),
// goes one by one too, and leaves nothing behind.
func TestTryAcquireAllServerTxnLimit(t *testing.T) {
	env := append(slices.Clone(fastElection), "ETCD_MAX_TXN_OPS=4")
	srv := dlocktest.RequireNewWith(t, dlocktest.Etcd, &dlocktest.StartOptions{Env: env})
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	for _, perLock := range []bool{false, true} {
		l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix, LeasePerLock: perLock})
		names := []string{"few/a", "few/b", "few/c", "few/d", "few/e"}
		ls, err := l.TryAcquireAll(ctx, names, nil)
		if err != nil {
			t.Fatalf("LeasePerLock=%v: TryAcquireAll of 5 names, server limit 4: %v; want the one-by-one path", perLock, err)
		}
		fences, _ := ls.Fences()
		if fences[0] == fences[4] {
			t.Errorf("LeasePerLock=%v: fences %v; want one revision each (one by one)", perLock, fences)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatalf("LeasePerLock=%v: Release: %v", perLock, err)
		}
		for _, n := range names {
			if kvs := queueKeys(t, ctx, raw, prefix, n).Kvs; len(kvs) != 0 {
				t.Errorf("LeasePerLock=%v: %d keys under %q after Release; want none", perLock, len(kvs), n)
			}
		}
	}
}
