package zookeeper_test

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// BenchmarkHandoffPeer times handoffs through dlock and through
// go-zookeeper's zk.Lock in the same run, alternating, each as `dlock bench
// -peers` times them (the bench's handoffOnce): the holder releases at
// t0 (its ctx has a Done channel, as the bench's does), the waiter blocked in
// Acquire (zk.Lock: Lock in a goroutine of its own, as the bench's peer
// runs it) for a settle time returns at t1. It reports both p50s and their
// ratio, and splits each handoff with the times the frames crossed the
// clients' sockets:
//
//	rel   t0 → the holder's delete written
//	srv   delete written → the waiter read the watch event
//	wake  watch event read → the waiter's listing written
//	list  listing written → its reply read
//	ret   reply read → Acquire returned (t1); a grant made on the watch
//	      event itself (no listing): event read → t1, wake and list 0
//
//	DLOCK_REQUIRE_BACKENDS=1 go test -run '^$' -bench HandoffPeer -benchtime 300x ./zookeeper/
func BenchmarkHandoffPeer(b *testing.B) {
	srv := zkServer(b)
	ctx, cancelAll := context.WithCancel(context.Background()) // a Done channel, as the bench's
	defer cancelAll()
	const ttl = 10 * time.Second
	const settle = 20 * time.Millisecond
	dialer := func(tr *tracer) zk.Dialer {
		return func(network, addr string, timeout time.Duration) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, timeout)
			if err != nil {
				return nil, err
			}
			return &tracedConn{Conn: c, tr: tr}, nil
		}
	}
	var dh, dw, zh, zw tracer
	holder := connect(b, srv.Addr(), &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}, Dialer: dialer(&dh)})
	waiter := connect(b, srv.Addr(), &zookeeper.Options{Defaults: dlock.Options{TTL: ttl}, Dialer: dialer(&dw)})
	zkConn := func(tr *tracer) *zk.Conn {
		c, _, err := zk.Connect([]string{srv.Addr()}, ttl, zk.WithLogger(quiet), zk.WithDialer(dialer(tr)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		for c.State() != zk.StateHasSession {
			time.Sleep(5 * time.Millisecond)
		}
		return c
	}
	zhc, zwc := zkConn(&zh), zkConn(&zw)
	name := "bench-handoff-peer-" + randomHex(4)
	zpath := zookeeper.LockPath("", "bench-handoff-zk-"+randomHex(4))
	b.Cleanup(func() { _ = zhc.Delete(zpath, -1) })

	dlockOnce := func() (time.Time, time.Time) {
		ls, err := holder.TryAcquire(ctx, name, nil)
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, settle+ttl+5*time.Second)
		defer cancel()
		type outcome struct {
			ls *dlock.Lease
			at time.Time
		}
		done := make(chan outcome, 1)
		go func() {
			wl, err := waiter.Acquire(wctx, name, nil)
			if err != nil {
				b.Error(err)
			}
			done <- outcome{wl, time.Now()}
		}()
		time.Sleep(settle)
		dh.reset()
		dw.reset()
		t0 := time.Now()
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		o := <-done
		if o.ls == nil {
			b.FailNow()
		}
		if err := o.ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
		return t0, o.at
	}
	zkOnce := func() (time.Time, time.Time) {
		hl := zk.NewLock(zhc, zpath, zk.WorldACL(zk.PermAll))
		if err := hl.Lock(); err != nil {
			b.Fatal(err)
		}
		wl := zk.NewLock(zwc, zpath, zk.WorldACL(zk.PermAll))
		done := make(chan time.Time, 1)
		go func() {
			result := make(chan error)
			go func() { result <- wl.Lock() }()
			if err := <-result; err != nil {
				b.Error(err)
			}
			done <- time.Now()
		}()
		time.Sleep(settle)
		zh.reset()
		zw.reset()
		t0 := time.Now()
		if err := hl.Unlock(); err != nil {
			b.Fatal(err)
		}
		t1 := <-done
		if err := wl.Unlock(); err != nil {
			b.Fatal(err)
		}
		return t0, t1
	}
	var ds, zs [][5]time.Duration
	var dt, zt []time.Duration
	for i := -10; i < b.N; i++ {
		run := func(first bool) {
			if first == (i%2 == 0) {
				t0, t1 := dlockOnce()
				if i >= 0 {
					dt = append(dt, t1.Sub(t0))
					ds = append(ds, split(t0, t1, &dh, &dw))
				}
			} else {
				t0, t1 := zkOnce()
				if i >= 0 {
					zt = append(zt, t1.Sub(t0))
					zs = append(zs, split(t0, t1, &zh, &zw))
				}
			}
		}
		run(true)
		run(false)
	}
	b.StopTimer()
	p50 := func(s []time.Duration) float64 {
		s = slices.Clone(s)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds())
	}
	b.ReportMetric(p50(dt), "dlock-p50-ns")
	b.ReportMetric(p50(zt), "zklock-p50-ns")
	b.ReportMetric(p50(dt)/p50(zt), "p50-ratio")
	for j, part := range []string{"rel", "srv", "wake", "list", "ret"} {
		var d, z []time.Duration
		for _, s := range ds {
			d = append(d, s[j])
		}
		for _, s := range zs {
			z = append(z, s[j])
		}
		b.ReportMetric(p50(d), "dlock-"+part+"-ns")
		b.ReportMetric(p50(z), "zklock-"+part+"-ns")
	}
}

// split cuts a handoff from t0 to t1 at the frames the holder's (h) and
// the waiter's (w) sockets carried (see BenchmarkHandoffPeer).
func split(t0, t1 time.Time, h, w *tracer) [5]time.Duration {
	h.mu.Lock()
	hf := slices.Clone(h.frames)
	h.mu.Unlock()
	w.mu.Lock()
	wf := slices.Clone(w.frames)
	w.mu.Unlock()
	var del, ev, list, reply time.Time
	for _, f := range hf {
		if f.write && (f.op == 2 || f.op == 14) {
			del = f.at
			break
		}
	}
	var xid int32
	for _, f := range wf {
		switch {
		case ev.IsZero():
			if !f.write && f.xid == -1 && !f.at.Before(del) {
				ev = f.at
			}
		case list.IsZero():
			if f.write && (f.op == 8 || f.op == 12) {
				list, xid = f.at, f.xid
			}
		case reply.IsZero():
			if !f.write && f.xid == xid {
				reply = f.at
			}
		}
	}
	switch {
	case del.IsZero() || ev.IsZero():
		return [5]time.Duration{}
	case list.IsZero() || reply.IsZero() || list.After(t1):
		// Granted on the watch event, without a listing.
		return [5]time.Duration{del.Sub(t0), ev.Sub(del), 0, 0, t1.Sub(ev)}
	}
	return [5]time.Duration{del.Sub(t0), ev.Sub(del), list.Sub(ev), reply.Sub(list), t1.Sub(reply)}
}

// tracer records the frames a client's sockets carried.
type tracer struct {
	mu     sync.Mutex
	frames []frame
}

type frame struct {
	at    time.Time
	write bool
	xid   int32
	op    int32 // writes
}

func (t *tracer) reset() {
	t.mu.Lock()
	t.frames = t.frames[:0]
	t.mu.Unlock()
}

func (t *tracer) add(f frame) {
	t.mu.Lock()
	t.frames = append(t.frames, f)
	t.mu.Unlock()
}

// tracedConn is a client socket whose frames a tracer records. go-zookeeper
// writes a frame per Write and reads each frame's length, then its body.
type tracedConn struct {
	net.Conn
	tr       *tracer
	wantBody bool
}

func (c *tracedConn) Write(p []byte) (int, error) {
	now := time.Now()
	if len(p) >= 12 {
		c.tr.add(frame{at: now, write: true, xid: int32(binary.BigEndian.Uint32(p[4:8])), op: int32(binary.BigEndian.Uint32(p[8:12]))})
	}
	return c.Conn.Write(p)
}

func (c *tracedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case n == 4 && len(p) == 4 && !c.wantBody:
		c.wantBody = true
	case c.wantBody && n >= 4:
		c.wantBody = false
		c.tr.add(frame{at: time.Now(), xid: int32(binary.BigEndian.Uint32(p[:4]))})
	}
	return n, err
}

// BenchmarkContendedPeer: 8 workers, each with a client of its own, take one
// name in turns for a second, through dlock and through zk.Lock, four rounds
// each, alternating; it reports both throughputs and their ratio (dlock over
// zk.Lock). ctx has a Done channel, as dlock bench's. Run it once
// (-benchtime 1x).
func BenchmarkContendedPeer(b *testing.B) {
	srv := zkServer(b)
	ctx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	const workers, rounds, ttl = 8, 4, 10 * time.Second
	lockers := make([]*dlock.Locker, workers)
	conns := make([]*zk.Conn, workers)
	for i := range workers {
		lockers[i] = connect(b, srv.Addr(), withTTL(ttl))
		conns[i] = rawConn(b, srv.Addr(), ttl)
	}
	name := "bench-contended-" + randomHex(4)
	zpath := zookeeper.LockPath("", "bench-contended-zk-"+randomHex(4))
	b.Cleanup(func() { _ = conns[0].Delete(zpath, -1) })
	run := func(cycle func(i int) error) float64 {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			total int
		)
		stop := time.Now().Add(time.Second)
		for i := range workers {
			wg.Go(func() {
				n := 0
				for time.Now().Before(stop) {
					if err := cycle(i); err != nil {
						b.Error(err)
						return
					}
					n++
				}
				mu.Lock()
				total += n
				mu.Unlock()
			})
		}
		wg.Wait()
		return float64(total)
	}
	dlockCycle := func(i int) error {
		ls, err := lockers[i].Acquire(ctx, name, nil)
		if err != nil {
			return err
		}
		return ls.Release(ctx)
	}
	zkCycle := func(i int) error {
		l := zk.NewLock(conns[i], zpath, zk.WorldACL(zk.PermAll))
		if err := l.Lock(); err != nil {
			return err
		}
		return l.Unlock()
	}
	var d, z float64
	for r := range rounds {
		if r%2 == 0 {
			d += run(dlockCycle)
			z += run(zkCycle)
		} else {
			z += run(zkCycle)
			d += run(dlockCycle)
		}
	}
	b.ReportMetric(d/rounds, "dlock-ops/s")
	b.ReportMetric(z/rounds, "zklock-ops/s")
	b.ReportMetric(d/z, "ops-ratio")
}
