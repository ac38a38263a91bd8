package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/tests/internal/testutil"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// allNames returns k names unique to the test.
func allNames(k int) []string {
	prefix := "all-" + testutil.RandomHex(4) + "-"
	names := make([]string, k)
	for i := range names {
		names[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return names
}

// keepParents creates a persistent child (not a lock node) under each
// name's node, so that the server does not delete the node between the
// test's steps; TryAcquireAll then finds each of its nodes not alone, and
// lists.
func keepParents(t *testing.T, raw *zk.Conn, names []string) {
	t.Helper()
	for _, n := range names {
		p := zookeeper.LockPath("", n)
		if _, err := raw.Create(zookeeper.DefaultRoot, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
		if _, err := raw.CreateContainer(p, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
		if _, err := raw.Create(p+"/keep", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Delete(p+"/keep", -1) })
	}
}

// TestTryAcquireAllOneMultiOp: an uncontended TryAcquireAll creates every
// name's lock node in one multi-op (its nodes share the transaction's
// zxid, so their fences are equal), where the names one by one take a
// multi-op each: granted at once when each node is alone under its name,
// after listing the names whose node is not. When one name is busy it takes
// none, in two multi-ops (the creates, then the deletes), and leaves no node
// of its own behind.
func TestTryAcquireAllOneMultiOp(t *testing.T) {
	srv := zkServer(t)
	ec := &existsCounter{}
	o := withTTL(20 * time.Second)
	o.Dialer = ec.dial
	l := connect(t, srv.Addr(), o)
	other := connect(t, srv.Addr(), withTTL(20*time.Second))
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const k = 5
	for _, keep := range []bool{false, true} {
		names := allNames(k)
		if keep {
			keepParents(t, raw, names)
		}
		m0, sd0 := ec.multis.Load(), ec.setDatas.Load()
		ls, err := l.TryAcquireAll(ctx, names, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, sd := ec.multis.Load()-m0, ec.setDatas.Load()-sd0
		if m != 1 || sd != k {
			t.Errorf("TryAcquireAll of %d free names (other children: %v): %d multi-ops carrying %d creates; want 1 carrying %d", k, keep, m, sd, k)
		}
		fences, _ := ls.Fences()
		if slices.Min(fences) != slices.Max(fences) || fences[0] == 0 {
			t.Errorf("fences %v: want one transaction's zxid for every name", fences)
		}
		for _, n := range names {
			if _, err := other.TryAcquire(ctx, n, nil); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire(%q) while TryAcquireAll holds it: %v; want ErrNotAcquired", n, err)
			}
		}
		release(t, ls)
		if !keep {
			continue
		}

		// One name busy: nothing taken, nothing left. (The kept children
		// keep the names' nodes from being deleted meanwhile.)
		held, err := other.TryAcquire(ctx, names[2], nil)
		if err != nil {
			t.Fatal(err)
		}
		m0 = ec.multis.Load()
		if _, err := l.TryAcquireAll(ctx, names, nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquireAll with %q held: %v; want ErrNotAcquired", names[2], err)
		}
		if m := ec.multis.Load() - m0; m != 2 {
			t.Errorf("TryAcquireAll with one name busy: %d multi-ops; want 2 (the creates, the deletes)", m)
		}
		for _, n := range names {
			nodes, err := lockNodes(raw, n)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if n == names[2] {
				want = 1 // the holder's
			}
			if len(nodes) != want {
				t.Errorf("after the busy TryAcquireAll, lock nodes of %q: %v; want %d", n, nodes, want)
			}
		}
		release(t, held)
	}
}

// BenchmarkTryAcquireAll times TryAcquireAll of k free names (one
// multi-op) against k TryAcquire calls one after another, the releases
// not timed.
func BenchmarkTryAcquireAll(b *testing.B) {
	srv := zkServer(b)
	l := connect(b, srv.Addr(), withTTL(20*time.Second))
	testutil.BenchTryAcquireAll(b, l, allNames)
}
