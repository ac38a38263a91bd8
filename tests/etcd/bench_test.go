package etcd_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The benchmarks measure the figures in one run, on the test
// server:
//
//   - BenchmarkRatio: TryAcquire + Release through dlock against the raw
//     floor (a create-if-absent transaction with a lease, then a
//     compare-and-delete), interleaved so that both meet the same load;
//     p50-ratio is dlock over the floor.
//   - BenchmarkHandoff: the time from a holder's release to its waiter's
//     grant, against the same client's uncontended acquire + release, for
//     dlock and for concurrency.Mutex (handoff-over-unc).
//   - BenchmarkContended: 8 workers, each with its own client, taking one
//     name in turns, dlock and concurrency.Mutex alternating in rounds;
//     ops-ratio is dlock's ops/s over the Mutex's.
//
//	go test -run '^$' -bench . ./etcd/
//
// BenchmarkHandoff and BenchmarkContended do a fixed amount of work per
// iteration and run once at the default -benchtime; do not pass an
// iteration count (-benchtime Nx) to them.

// latencies records one duration per iteration and reports percentiles.
type latencies []time.Duration

func (l latencies) p(q int) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[(len(s)-1)*q/100]
}

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	b.ReportMetric(float64(l.p(50).Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(l.p(99).Nanoseconds()), prefix+"p99-ns")
}

// benchLocker returns a Locker on a client of its own.
func benchLocker(b *testing.B, addr, prefix string) *dlock.Locker {
	l := newLocker(b, newClient(b, addr), &etcd.Options{KeyPrefix: prefix})
	return l
}

// benchPrefix returns a key prefix for one benchmark, emptied at cleanup.
func benchPrefix(b *testing.B, raw *clientv3.Client) string {
	p := "dlockbench/" + randomHex(4) + "/"
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = raw.Delete(ctx, p, clientv3.WithPrefix())
	})
	return p
}

// cycle is one acquire + release; ctx bounds the acquire only.
type cycle func(ctx context.Context) error

// releaseCtx bounds a release made after the acquire's ctx may have ended.
func releaseCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

func dlockCycle(l *dlock.Locker, name string, try bool) cycle {
	return func(ctx context.Context) error {
		acquire := l.Acquire
		if try {
			acquire = l.TryAcquire
		}
		ls, err := acquire(ctx, name, nil)
		if err != nil {
			return err
		}
		rctx, cancel := releaseCtx(ctx)
		defer cancel()
		return ls.Release(rctx)
	}
}

func floorCycle(b *testing.B, addr, prefix, name string) cycle {
	open, err := bench.EtcdFloors(&url.URL{Scheme: "etcd", Host: addr, Path: prefix})
	if err != nil {
		b.Fatal(err)
	}
	f, err := open(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	var seq int
	return func(ctx context.Context) error {
		seq++
		token := "floor-" + strconv.Itoa(seq)
		ok, err := f.TryLock(ctx, name, token, dlock.DefaultTTL)
		rctx, cancel := releaseCtx(ctx)
		defer cancel()
		if err != nil || !ok {
			_ = f.Unlock(rctx, name, token) // the put may have happened
			return fmt.Errorf("floor TryLock: %v, %v", ok, err)
		}
		return f.Unlock(rctx, name, token)
	}
}

func mutexCycle(m *concurrency.Mutex) cycle {
	return func(ctx context.Context) error {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		rctx, cancel := releaseCtx(ctx)
		defer cancel()
		return m.Unlock(rctx)
	}
}

// time runs c n times (after a warm-up) and returns each duration.
func timeCycles(b *testing.B, c cycle, n int) latencies {
	ctx := context.Background()
	for range 20 {
		if err := c(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lat := make(latencies, 0, n)
	for range n {
		start := time.Now()
		if err := c(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return lat
}

// BenchmarkAcquireRelease times one uncontended cycle through dlock
// (TryAcquire or Acquire, then Release, with the watchdog on), through the
// raw floor, and through concurrency.Mutex.
func BenchmarkAcquireRelease(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	for _, bc := range []struct {
		name string
		c    func(prefix string) cycle
	}{
		{"dlock-try", func(p string) cycle { return dlockCycle(benchLocker(b, srv.Addr(), p), "n", true) }},
		{"dlock-acquire", func(p string) cycle { return dlockCycle(benchLocker(b, srv.Addr(), p), "n", false) }},
		{"floor", func(p string) cycle { return floorCycle(b, srv.Addr(), p, "n") }},
		{"mutex", func(p string) cycle { return mutexCycle(concurrency.NewMutex(benchSession(b, srv.Addr()), p+"n")) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := bc.c(benchPrefix(b, raw))
			b.ResetTimer()
			lat := timeCycles(b, c, b.N)
			b.StopTimer()
			lat.report(b, "")
		})
	}
}

func benchSession(b *testing.B, addr string) *concurrency.Session {
	s, err := concurrency.NewSession(newClient(b, addr), concurrency.WithTTL(int(dlock.DefaultTTL/time.Second)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkRatio alternates a dlock cycle (TryAcquire + Release) and a
// floor cycle, and reports both p50s and their ratio (dlock/floor).
func BenchmarkRatio(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	prefix := benchPrefix(b, raw)
	cycles := []cycle{dlockCycle(benchLocker(b, srv.Addr(), prefix), "ratio", true), floorCycle(b, srv.Addr(), prefix, "floor")}
	ctx := context.Background()
	for _, c := range cycles {
		timeCycles(b, c, 20)
	}
	lat := [2]latencies{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, c := range cycles {
			start := time.Now()
			if err := c(ctx); err != nil {
				b.Fatal(err)
			}
			lat[j] = append(lat[j], time.Since(start))
		}
	}
	b.StopTimer()
	d, f := lat[0].p(50), lat[1].p(50)
	b.ReportMetric(float64(d.Nanoseconds()), "dlock-p50-ns")
	b.ReportMetric(float64(f.Nanoseconds()), "floor-p50-ns")
	b.ReportMetric(float64(d)/float64(f), "p50-ratio")
}

// BenchmarkRatioPeer is BenchmarkRatio with concurrency.Mutex
// (TryLock + Unlock, a Session of its own, as dlock bench -peers runs it)
// as a third cycle, the three taking turns in a rotating order, under a ctx
// with a Done channel (as the bench's): it reports the three p50s and
// dlock's over the Mutex's and over the floor's.
//
// Each dlock acquisition puts a key of its own (P N/<token>), and the
// try-lock compares the create revision of the whole range "P N/": without
// a compaction the deleted keys stay in etcd's index and the compare visits
// each of them, so dlock's cycle grows with -benchtime (the Mutex reuses
// one key per Session, the floor one key per name).
func BenchmarkRatioPeer(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	prefix := benchPrefix(b, raw)
	m := concurrency.NewMutex(benchSession(b, srv.Addr()), prefix+"mutex")
	try := func(ctx context.Context) error {
		if err := m.TryLock(ctx); err != nil {
			return err
		}
		rctx, cancel := releaseCtx(ctx)
		defer cancel()
		return m.Unlock(rctx)
	}
	cycles := []cycle{dlockCycle(benchLocker(b, srv.Addr(), prefix), "ratio", true), floorCycle(b, srv.Addr(), prefix, "floor"), try}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range cycles {
		timeCycles(b, c, 20)
	}
	lat := [3]latencies{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range cycles {
			j := (i + k) % len(cycles)
			start := time.Now()
			if err := cycles[j](ctx); err != nil {
				b.Fatal(err)
			}
			lat[j] = append(lat[j], time.Since(start))
		}
	}
	b.StopTimer()
	d, f, mu := lat[0].p(50), lat[1].p(50), lat[2].p(50)
	b.ReportMetric(float64(d.Nanoseconds()), "dlock-p50-ns")
	b.ReportMetric(float64(f.Nanoseconds()), "floor-p50-ns")
	b.ReportMetric(float64(mu.Nanoseconds()), "mutex-p50-ns")
	b.ReportMetric(float64(d)/float64(mu), "p50-ratio-mutex")
	b.ReportMetric(float64(d)/float64(f), "p50-ratio-floor")
}

// handoffs times n handoffs: hold, let the waiter block for settle, release
// at t0; the waiter's acquire returns at t1. hold and wait take the lock,
// and return its release.
func handoffs(b *testing.B, n int, settle time.Duration, hold, wait func(ctx context.Context) (func(context.Context) error, error)) latencies {
	ctx := context.Background()
	lat := make(latencies, 0, n)
	for range n {
		release, err := hold(ctx)
		if err != nil {
			b.Fatal(err)
		}
		type granted struct {
			release func(context.Context) error
			at      time.Time
			err     error
		}
		got := make(chan granted, 1)
		go func() {
			r, err := wait(ctx)
			got <- granted{r, time.Now(), err}
		}()
		time.Sleep(settle)
		t0 := time.Now()
		if err := release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-got
		if g.err != nil {
			b.Fatal(g.err)
		}
		lat = append(lat, g.at.Sub(t0))
		if err := g.release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return lat
}

func dlockHold(l *dlock.Locker, name string) func(context.Context) (func(context.Context) error, error) {
	return func(ctx context.Context) (func(context.Context) error, error) {
		ls, err := l.Acquire(ctx, name, nil)
		if err != nil {
			return nil, err
		}
		return ls.Release, nil
	}
}

func mutexHold(m *concurrency.Mutex) func(context.Context) (func(context.Context) error, error) {
	return func(ctx context.Context) (func(context.Context) error, error) {
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return m.Unlock, nil
	}
}

// BenchmarkHandoff reports, for dlock and for concurrency.Mutex, the
// handoff p50 and p99 (100 handoffs, settle 20ms as in dlock bench), the
// uncontended cycle p50 of the same clients, and handoff p50 over
// uncontended p50.
func BenchmarkHandoff(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	const n, settle = 100, 20 * time.Millisecond
	for i := 0; i < b.N; i++ {
		prefix := benchPrefix(b, raw)
		dh, dw := benchLocker(b, srv.Addr(), prefix), benchLocker(b, srv.Addr(), prefix)
		mh := concurrency.NewMutex(benchSession(b, srv.Addr()), prefix+"mutex")
		mw := concurrency.NewMutex(benchSession(b, srv.Addr()), prefix+"mutex")
		dUnc := timeCycles(b, dlockCycle(dh, "dlock", false), n)
		mUnc := timeCycles(b, mutexCycle(mh), n)
		dHand := handoffs(b, n, settle, dlockHold(dh, "dlock"), dlockHold(dw, "dlock"))
		mHand := handoffs(b, n, settle, mutexHold(mh), mutexHold(mw))
		dHand.report(b, "dlock-handoff-")
		mHand.report(b, "mutex-handoff-")
		b.ReportMetric(float64(dUnc.p(50).Nanoseconds()), "dlock-unc-p50-ns")
		b.ReportMetric(float64(mUnc.p(50).Nanoseconds()), "mutex-unc-p50-ns")
		b.ReportMetric(float64(dHand.p(50))/float64(dUnc.p(50)), "dlock-handoff-over-unc")
		b.ReportMetric(float64(mHand.p(50))/float64(mUnc.p(50)), "mutex-handoff-over-unc")
	}
}

// contended runs one worker per cycle (each a lock + unlock on the shared
// name) for d and returns the cycles completed per second.
func contended(b *testing.B, workers []cycle, d time.Duration) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	start := time.Now()
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for ctx.Err() == nil {
				if err := w(ctx); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					break
				}
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

// BenchmarkContended reports the ops/s of 8 workers, each with its own
// client, on one name: through dlock and through concurrency.Mutex, in
// alternating 2s rounds (3 each), and their ratio.
func BenchmarkContended(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	const workers, rounds, d = 8, 3, 2 * time.Second
	for i := 0; i < b.N; i++ {
		prefix := benchPrefix(b, raw)
		var dl, mu []cycle
		for range workers {
			dl = append(dl, dlockCycle(benchLocker(b, srv.Addr(), prefix), "dlock", false))
			mu = append(mu, mutexCycle(concurrency.NewMutex(benchSession(b, srv.Addr()), prefix+"mutex")))
		}
		var dOps, mOps float64
		for range rounds {
			dOps += contended(b, dl, d) / rounds
			mOps += contended(b, mu, d) / rounds
		}
		b.ReportMetric(dOps, "dlock-ops/s")
		b.ReportMetric(mOps, "mutex-ops/s")
		b.ReportMetric(dOps/mOps, "ops-ratio")
	}
}

// spinCycle is the bench's floor worker: TryLock in a tight loop until it
// succeeds (the raw client's only way to wait), then Unlock.
func spinCycle(b *testing.B, addr, prefix, name, worker string) cycle {
	open, err := bench.EtcdFloors(&url.URL{Scheme: "etcd", Host: addr, Path: prefix})
	if err != nil {
		b.Fatal(err)
	}
	f, err := open(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	var seq int
	return func(ctx context.Context) error {
		seq++
		token := worker + "-" + strconv.Itoa(seq)
		for {
			ok, err := f.TryLock(ctx, name, token, dlock.DefaultTTL)
			if err != nil {
				return err
			}
			if ok {
				break
			}
		}
		rctx, cancel := releaseCtx(ctx)
		defer cancel()
		return f.Unlock(rctx, name, token)
	}
}

// serverCounters reads the etcd server's counters of interest from its
// /metrics: requests by gRPC method, and the mvcc, raft, disk and watch
// totals. Gauges (watchers) are read as they are.
func serverCounters(b *testing.B, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, val, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		if strings.HasSuffix(name, "_seconds_sum") {
			name, v = name+"_ms", v*1000
		}
		if rest, ok := strings.CutPrefix(name, "grpc_server_started_total{"); ok {
			if i := strings.Index(rest, `grpc_method="`); i >= 0 {
				m := rest[i+len(`grpc_method="`):]
				out["grpc-"+m[:strings.IndexByte(m, '"')]] += v
			}
			continue
		}
		switch name {
		case "etcd_mvcc_txn_total", "etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total",
			"etcd_server_proposals_committed_total", "etcd_disk_wal_fsync_duration_seconds_count",
			"etcd_disk_backend_commit_duration_seconds_count", "etcd_debugging_mvcc_events_total",
			"etcd_disk_wal_fsync_duration_seconds_sum_ms",
			"etcd_debugging_mvcc_watcher_total", "etcd_network_client_grpc_received_bytes_total",
			"etcd_network_client_grpc_sent_bytes_total":
			out[strings.TrimPrefix(strings.TrimPrefix(name, "etcd_"), "debugging_")] = v
		}
	}
	return out
}

// usage is the server's and this process's CPU time so far.
func usage(b *testing.B, srv interface{ CPUTime() (time.Duration, error) }) (server, client time.Duration) {
	s, err := srv.CPUTime()
	if err != nil {
		s = -1
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	c := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return s, c
}

// BenchmarkContendedFloor reports the ops/s of 8 workers, each with its own
// client, on one name: through dlock (Acquire, a Locker each) and through
// the bench's raw floor (spinning TryLock), in alternating rounds (a fresh
// name each), and their ratio (ops-ratio-floor, the bench's "cont ops
// ×floor"), with what each op cost: the server's requests by gRPC method,
// mvcc operations, raft proposals, WAL fsyncs, watch events sent, and the
// server's and this process's CPU time.
//
// What it showed on a 2-core machine shared with other work (2026-11-26):
// dlock costs 2 commits (the queue put and the release; 2.03 WAL fsyncs
// per op), 1 read-only transaction (the waiter's re-read after its
// predecessor's deletion: it queued behind 7 others, so its predecessor was
// not the holder then), 1 watch and ~18 watch events (8 Lockers' prefix
// watches see each put and delete) per op, 2.2-3.7 ms of client and
// 2.3-3.8 ms of server CPU; the floor 16-60 transactions (its spins) and
// 11-34 ms of server CPU per op. With the CPU saturated dlock's throughput
// follows its CPU per op, not the length of its hand-off: same-run A/B
// (in-process toggles) of a re-read made serializably at the deletion's
// revision (0.95, 1.20, 0.78, 1.00, 0.88, 0.76 of the linearizable one's
// ops/s) and of that plus a watch on the predecessor's predecessor, so that
// most grants needed no read on the hand-off's path (0.89, 0.92: one more
// watch per op) gained nothing, and neither was kept. What did: a waiter
// on a shared etcd lease follows the Locker's watch, which delivered every
// event under the prefix anyway (queuewait.go): 2 transactions and no
// watch per op, 1.1-1.6 ms of client and 1.3-1.6 ms of server CPU, 1.12-1.59×
// the ops/s (alternating test binaries). The floor's spins need spare CPU:
// how the ratio to it comes out depends on the machine's load.
func BenchmarkContendedFloor(b *testing.B) {
	srv, _ := etcdServer(b)
	raw := newClient(b, srv.Addr())
	const workers = 8
	rounds, d := 4, time.Second
	if s := os.Getenv("DLOCK_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	for i := 0; i < b.N; i++ {
		prefix := benchPrefix(b, raw)
		var dls []*dlock.Locker
		var fl []cycle
		for w := range workers {
			dls = append(dls, benchLocker(b, srv.Addr(), prefix))
			fl = append(fl, spinCycle(b, srv.Addr(), prefix, "f"+strconv.Itoa(i), "w"+strconv.Itoa(w)))
		}
		type totals struct {
			ops, sec     float64
			server, proc time.Duration
			counters     map[string]float64
		}
		sum := [2]*totals{{counters: map[string]float64{}}, {counters: map[string]float64{}}}
		run := func(j, round int, ws []cycle) {
			c0 := serverCounters(b, srv.Addr())
			s0, p0 := usage(b, srv)
			start := time.Now()
			rate := contended(b, ws, d)
			el := time.Since(start)
			ops := rate * el.Seconds()
			s1, p1 := usage(b, srv)
			c1 := serverCounters(b, srv.Addr())
			t := sum[j]
			t.ops += ops
			t.sec += el.Seconds()
			t.server += s1 - s0
			t.proc += p1 - p0
			for k, v := range c1 {
				t.counters[k] += v - c0[k]
			}
		}
		for r := range rounds {
			var dl []cycle
			for _, l := range dls {
				dl = append(dl, dlockCycle(l, "d"+strconv.Itoa(i)+"-"+strconv.Itoa(r), false))
			}
			order := [][]cycle{dl, fl}
			for k := range 2 {
				j := (r + k) % 2
				run(j, r, order[j])
			}
		}
		for j, name := range []string{"dlock", "floor"} {
			t := sum[j]
			b.ReportMetric(t.ops/t.sec, name+"-ops/s")
			b.ReportMetric(float64(t.server.Microseconds())/t.ops, name+"-srvcpu-us/op")
			b.ReportMetric(float64(t.proc.Microseconds())/t.ops, name+"-cltcpu-us/op")
			if testing.Verbose() {
				keys := slices.Sorted(maps.Keys(t.counters))
				var sb strings.Builder
				for _, k := range keys {
					if v := t.counters[k]; v != 0 {
						fmt.Fprintf(&sb, " %s=%.2f", k, v/t.ops)
					}
				}
				b.Logf("%s per op (%.0f ops):%s", name, t.ops, sb.String())
			}
		}
		b.ReportMetric((sum[0].ops/sum[0].sec)/(sum[1].ops/sum[1].sec), "ops-ratio-floor")
	}
}
