package zookeeper_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// The benchmarks compare one uncontended lock/unlock cycle through dlock with
// go-zookeeper's own zk.Lock on the same server: both are three round trips
// (create, list the children, delete). Run them with
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench . -benchtime 2000x ./zookeeper/
//
// BenchmarkRatio interleaves the two to cancel drift in the machine's load
// and reports both p50s and their ratio.

// BenchmarkRatio alternates a dlock Acquire+Release and a zk.Lock
// Lock+Unlock, each on a name of its own, and reports both p50s, p99s and
// the p50 ratio (dlock over zk.Lock); ns/op covers both cycles.
func BenchmarkRatio(b *testing.B) {
	srv := zkServer(b)
	ctx := context.Background()
	l := connect(b, srv.Addr(), withTTL(10*time.Second))
	conn := rawConn(b, srv.Addr(), 10*time.Second)
	name := "bench-dlock-" + randomHex(4)
	zpath := zookeeper.LockPath("", "bench-zklock-"+randomHex(4))
	zl := zk.NewLock(conn, zpath, zk.WorldACL(zk.PermAll))
	b.Cleanup(func() { _ = conn.Delete(zpath, -1) }) // zk.Lock makes it persistent
	dlockCycle := func() {
		ls, err := l.Acquire(ctx, name, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	zkCycle := func() {
		if err := zl.Lock(); err != nil {
			b.Fatal(err)
		}
		if err := zl.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
	for range 20 { // connections, sessions, parent nodes
		dlockCycle()
		zkCycle()
	}
	dl := make([]time.Duration, 0, b.N)
	zkl := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		// Alternate which goes first, so that neither always follows the other.
		t0 := time.Now()
		if i%2 == 0 {
			dlockCycle()
		} else {
			zkCycle()
		}
		t1 := time.Now()
		if i%2 == 0 {
			zkCycle()
		} else {
			dlockCycle()
		}
		t2 := time.Now()
		if i%2 == 0 {
			dl, zkl = append(dl, t1.Sub(t0)), append(zkl, t2.Sub(t1))
		} else {
			zkl, dl = append(zkl, t1.Sub(t0)), append(dl, t2.Sub(t1))
		}
	}
	b.StopTimer()
	slices.Sort(dl)
	slices.Sort(zkl)
	p := func(s []time.Duration, q int) float64 { return float64(s[len(s)*q/100].Nanoseconds()) }
	b.ReportMetric(p(dl, 50), "dlock-p50-ns")
	b.ReportMetric(p(zkl, 50), "zklock-p50-ns")
	b.ReportMetric(p(dl, 99), "dlock-p99-ns")
	b.ReportMetric(p(zkl, 99), "zklock-p99-ns")
	b.ReportMetric(p(dl, 50)/p(zkl, 50), "p50-ratio")
}

// BenchmarkHandoff measures, within one run, dlock's uncontended
// Acquire+Release p50 and its handoff p50: a waiter blocked in Acquire, the
// holder releases at t0, the waiter's Acquire returns at t1.
func BenchmarkHandoff(b *testing.B) {
	srv := zkServer(b)
	ctx := context.Background()
	holder := connect(b, srv.Addr(), withTTL(10*time.Second))
	waiter := connect(b, srv.Addr(), withTTL(10*time.Second))
	name := "bench-handoff-" + randomHex(4)
	unc := make([]time.Duration, 0, b.N)
	hand := make([]time.Duration, 0, b.N)
	for i := -5; i < b.N; i++ { // 5 rounds of warm-up
		t0 := time.Now()
		ls, err := holder.Acquire(ctx, name, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		u := time.Since(t0)

		ls, err = holder.Acquire(ctx, name, nil)
		if err != nil {
			b.Fatal(err)
		}
		c := acquireAsync(ctx, waiter, name)
		time.Sleep(20 * time.Millisecond) // let it reach its wait
		t1 := time.Now()
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		r := <-c
		h := time.Since(t1)
		if r.err != nil {
			b.Fatal(r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		if i >= 0 {
			unc, hand = append(unc, u), append(hand, h)
		}
	}
	slices.Sort(unc)
	slices.Sort(hand)
	b.ReportMetric(float64(unc[len(unc)/2].Nanoseconds()), "unc-p50-ns")
	b.ReportMetric(float64(hand[len(hand)/2].Nanoseconds()), "handoff-p50-ns")
	b.ReportMetric(float64(hand[len(hand)/2])/float64(unc[len(unc)/2]), "handoff/unc")
}

// BenchmarkConformance runs the conformance suite's benchmarks (through the
// harness's fault proxies): acquire+release percentiles, independent names,
// and 8 lockers contending for one name, with fairness.
func BenchmarkConformance(b *testing.B) {
	srv := zkServer(b)
	conformance.Benchmark(b, harness{addr: srv.Addr(), root: "/dlock-bench"})
}
