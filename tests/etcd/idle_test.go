package etcd_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/etcd"
	"github.com/dlock/dlock/internal/testexport/etcdexport"
)

// serverMetric reads one value of the etcd server's Prometheus metrics.
func serverMetric(ctx context.Context, addr, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found (%v)", name, sc.Err())
}

// TestIdleLockerHearsNothing proves that a Locker whose locks are gone stops
// its watch once idle: the server counts no watcher for it, and another
// Locker's operations under the same prefix send it no events (before, every
// put and delete went to every Locker). Its next acquisition starts the
// watch again, which then reports a deletion behind its back.
func TestIdleLockerHearsNothing(t *testing.T) {
	restore := etcdexport.SetIdleWatch(300 * time.Millisecond)
	defer restore()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv := dlocktest.RequireNew(t, dlocktest.Etcd) // its own: the server's counts are this test's
	addr := srv.Addr()
	raw := newClient(t, addr)
	prefix := testPrefix(t, raw, 0)
	busy := newLocker(t, newClient(t, addr), &etcd.Options{KeyPrefix: prefix})
	idle := newLocker(t, newClient(t, addr), &etcd.Options{KeyPrefix: prefix})
	metric := func(name string) float64 {
		t.Helper()
		v, err := serverMetric(ctx, addr, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	waitWatchers := func(want float64, why string) {
		t.Helper()
		for {
			if got := metric("etcd_debugging_mvcc_watcher_total"); got == want {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: the server never counted %v watchers (now %v)", why, want, metric("etcd_debugging_mvcc_watcher_total"))
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	cycle := func(l *dlock.Locker, name string) {
		t.Helper()
		ls, err := l.TryAcquire(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	keeper, err := busy.TryAcquire(ctx, "keeper", nil) // keeps busy's watch running
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(context.Background())
	waitWatchers(1, "busy's watch")
	cycle(idle, "idle-only")
	waitWatchers(2, "idle's watch after its acquisition")
	waitWatchers(1, "idle's watch after idleness")

	const ops = 50
	before := metric("etcd_debugging_mvcc_events_total")
	for range ops {
		cycle(busy, "shared-name")
	}
	sent := metric("etcd_debugging_mvcc_events_total") - before
	// busy's watch alone receives a put and a delete per cycle; were idle's
	// watch running it would receive as many.
	if sent < 2*ops || sent > 2*ops+ops/2 {
		t.Errorf("the server sent %v events for %d acquire+release cycles with one Locker idle; want %d (one watch), not %d (two)", sent, ops, 2*ops, 4*ops)
	}

	ls, err := idle.Acquire(ctx, "again", &dlock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Delete(ctx, prefix+"again/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls.Done():
		t.Logf("loss after the restarted watch saw the deletion: %v", ls.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("a lock deleted behind its back was not reported lost within 5s: the restarted watch missed it")
	}
}
