package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
)

// The primitives bench (dlock bench primitives): per backend, a
// semaphore's acquire+release latency and throughput, a read lock's
// acquire+release latency, and leader failover time.

// PrimTarget is one backend under test.
type PrimTarget struct {
	Backend string
	URL     string // redacted
	Open    func(ctx context.Context) (*dlock.Locker, error)
}

// PrimConfig sizes a primitives run.
type PrimConfig struct {
	N        int           // acquire+release samples; default 200
	Duration time.Duration // of the throughput turn; default 1s
	Workers  int           // default 8
	Limit    int           // the semaphore's limit; default 3
	Failover int           // failovers timed; default 5
	// TTL of the leaders in the failover rounds: default the larger of 1s
	// and the backend's MinTTL.
	TTL time.Duration
	// AllSizes are the numbers of names AcquireAll is timed with; default
	// 2, 5 and 20.
	AllSizes []int
	Progress io.Writer
}

func (c PrimConfig) withDefaults() PrimConfig {
	if c.N <= 0 {
		c.N = 200
	}
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.Limit <= 0 {
		c.Limit = 3
	}
	if c.Failover <= 0 {
		c.Failover = 5
	}
	if len(c.AllSizes) == 0 {
		c.AllSizes = []int{2, 5, 20}
	}
	return c
}

// PrimResult is one backend's figures; a nil figure was not measured
// (the backend lacks the primitive, or it failed: see Errors).
type PrimResult struct {
	Backend, URL string
	Unsupported  []string      // primitives the backend does not offer
	Semaphore    *Latency      // acquire+release, one worker, nobody else
	SemaphoreOps float64       // acquire+release/s of Workers workers sharing the limit
	Read         *Latency      // RLock+release, one worker
	Failover     *Latency      // leader stops refreshing → the next candidate's Elect returns
	Resign       *Latency      // leader resigns (Release returns) → the waiting candidate's Elect returns
	FailoverTTL  time.Duration // the leaders' TTL as granted (etcd raises short ones)
	All          []AllFigure   // AcquireAll against as many single acquisitions
	Errors       []string
}

// AllFigure is AcquireAll of K names + Release, against K Acquire calls one
// after another + K Releases, through one Locker, nobody else on the names.
type AllFigure struct {
	K            int
	All, Singles Latency
}

// RunPrimitives measures every target.
func RunPrimitives(ctx context.Context, cfg PrimConfig, targets []PrimTarget) []PrimResult {
	cfg = cfg.withDefaults()
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", a...)
		}
	}
	var out []PrimResult
	for _, t := range targets {
		res := PrimResult{Backend: t.Backend, URL: t.URL}
		fail := func(what string, err error) {
			res.Errors = append(res.Errors, what+": "+err.Error())
			say("%-9s %s FAILED: %v", t.Backend, what, err)
		}
		l, err := t.Open(ctx)
		if err != nil {
			fail("open", err)
			out = append(out, res)
			continue
		}
		caps := l.Capabilities()
		_ = l.Close(ctx)
		name := "dlock-bench-p:" + runID()
		if caps.Semaphore {
			if lat, err := primLatency(ctx, cfg, t, func(l *dlock.Locker) (func(context.Context) (*dlock.Lease, error), error) {
				sem, err := l.Semaphore(name+":sem1", cfg.Limit)
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context) (*dlock.Lease, error) { return sem.Acquire(ctx, nil) }, nil
			}); err != nil {
				fail("semaphore", err)
			} else {
				res.Semaphore = &lat
				say("%-9s semaphore acquire+release p50 %s p99 %s", t.Backend, FormatDuration(lat.P50), FormatDuration(lat.P99))
			}
			if ops, err := semThroughput(ctx, cfg, t, name+":sem8"); err != nil {
				fail("semaphore throughput", err)
			} else {
				res.SemaphoreOps = ops
				say("%-9s semaphore %d workers, limit %d: %s/s", t.Backend, cfg.Workers, cfg.Limit, formatOps(ops))
			}
		} else {
			res.Unsupported = append(res.Unsupported, "semaphore")
		}
		if caps.RWLock {
			if lat, err := primLatency(ctx, cfg, t, func(l *dlock.Locker) (func(context.Context) (*dlock.Lease, error), error) {
				rw, err := l.RWLock(name + ":rw")
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context) (*dlock.Lease, error) { return rw.RLock(ctx, nil) }, nil
			}); err != nil {
				fail("read lock", err)
			} else {
				res.Read = &lat
				say("%-9s read lock acquire+release p50 %s p99 %s", t.Backend, FormatDuration(lat.P50), FormatDuration(lat.P99))
			}
		} else {
			res.Unsupported = append(res.Unsupported, "rwlock")
		}
		if caps.Metadata && caps.Fencing {
			res.FailoverTTL = cfg.TTL
			if res.FailoverTTL <= 0 {
				res.FailoverTTL = max(time.Second, caps.MinTTL)
			}
			if lat, err := failover(ctx, cfg, t, name+":elect", res.FailoverTTL, &res.FailoverTTL); err != nil {
				fail("failover", err)
			} else {
				res.Failover = &lat
				say("%-9s leader failover p50 %s p99 %s (TTL %v)", t.Backend, FormatDuration(lat.P50), FormatDuration(lat.P99), res.FailoverTTL)
			}
			if lat, err := resign(ctx, cfg, t, name+":resign", res.FailoverTTL); err != nil {
				fail("resign", err)
			} else {
				res.Resign = &lat
				say("%-9s leader resign handover p50 %s p99 %s", t.Backend, FormatDuration(lat.P50), FormatDuration(lat.P99))
			}
		} else {
			res.Unsupported = append(res.Unsupported, "election")
		}
		for _, k := range cfg.AllSizes {
			f, err := allVsSingles(ctx, cfg, t, fmt.Sprintf("%s:all%d", name, k), k)
			if err != nil {
				fail(fmt.Sprintf("AcquireAll of %d", k), err)
				continue
			}
			res.All = append(res.All, f)
			say("%-9s AcquireAll of %d p50 %s, %d single acquisitions p50 %s", t.Backend, k, FormatDuration(f.All.P50), k, FormatDuration(f.Singles.P50))
		}
		out = append(out, res)
	}
	return out
}

// primLatency times cfg.N acquire+release pairs through one Locker.
func primLatency(ctx context.Context, cfg PrimConfig, t PrimTarget, prep func(*dlock.Locker) (func(context.Context) (*dlock.Lease, error), error)) (Latency, error) {
	l, err := t.Open(ctx)
	if err != nil {
		return Latency{}, err
	}
	defer closeLocker(l)
	acquire, err := prep(l)
	if err != nil {
		return Latency{}, err
	}
	samples := make([]time.Duration, 0, cfg.N)
	start := time.Now()
	for i := range cfg.N + 5 { // the first 5 warm up
		t0 := time.Now()
		ls, err := acquire(ctx)
		if err != nil {
			return Latency{}, err
		}
		if err := ls.Release(ctx); err != nil {
			return Latency{}, err
		}
		if i >= 5 {
			samples = append(samples, time.Since(t0))
		} else {
			start = time.Now()
		}
	}
	return Summarize(samples, time.Since(start)), nil
}

// allVsSingles times AcquireAll of k names + Release, and k Acquire + k
// Release, cfg.N/4 samples each (at least 10), alternating, through one
// Locker.
func allVsSingles(ctx context.Context, cfg PrimConfig, t PrimTarget, prefix string, k int) (AllFigure, error) {
	l, err := t.Open(ctx)
	if err != nil {
		return AllFigure{}, err
	}
	defer closeLocker(l)
	names := make([]string, k)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%02d", prefix, i)
	}
	n := max(cfg.N/4, 10)
	all := make([]time.Duration, 0, n)
	singles := make([]time.Duration, 0, n)
	held := make([]*dlock.Lease, k)
	var allTook, singlesTook time.Duration
	for i := range n + 2 { // the first 2 warm up
		t0 := time.Now()
		ls, err := l.AcquireAll(ctx, names, nil)
		if err != nil {
			return AllFigure{}, err
		}
		if err := ls.Release(ctx); err != nil {
			return AllFigure{}, err
		}
		t1 := time.Now()
		for j, name := range names {
			if held[j], err = l.Acquire(ctx, name, nil); err != nil {
				return AllFigure{}, err
			}
		}
		for _, ls := range held {
			if err := ls.Release(ctx); err != nil {
				return AllFigure{}, err
			}
		}
		t2 := time.Now()
		if i >= 2 {
			all, singles = append(all, t1.Sub(t0)), append(singles, t2.Sub(t1))
			allTook, singlesTook = allTook+t1.Sub(t0), singlesTook+t2.Sub(t1)
		}
	}
	return AllFigure{K: k, All: Summarize(all, allTook), Singles: Summarize(singles, singlesTook)}, nil
}

// semThroughput runs cfg.Workers workers, each with its own Locker, taking
// and giving back permits of one semaphore for cfg.Duration.
func semThroughput(ctx context.Context, cfg PrimConfig, t PrimTarget, name string) (float64, error) {
	sems := make([]*dlock.Semaphore, cfg.Workers)
	for i := range sems {
		l, err := t.Open(ctx)
		if err != nil {
			return 0, err
		}
		defer closeLocker(l)
		if sems[i], err = l.Semaphore(name, cfg.Limit); err != nil {
			return 0, err
		}
	}
	return parallel(ctx, cfg.Workers, cfg.Duration, func(w, _ int) (bool, error) {
		ls, err := sems[w].Acquire(ctx, nil)
		if err != nil {
			return false, err
		}
		return true, ls.Release(ctx)
	})
}

// failover times cfg.Failover failovers: a leader elected without refresh
// (its process stops refreshing at once), then a candidate's Elect; each
// sample runs from the leader's grant to the candidate's
// Elect returning, so it is the TTL plus what the backend and dlock add.
func failover(ctx context.Context, cfg PrimConfig, t PrimTarget, name string, ttl time.Duration, granted *time.Duration) (Latency, error) {
	a, b, err := twoLockers(ctx, t)
	if err != nil {
		return Latency{}, err
	}
	defer closeLocker(a)
	defer closeLocker(b)
	var samples []time.Duration
	start := time.Now()
	for i := range cfg.Failover {
		n := fmt.Sprintf("%s:%d", name, i)
		lead, err := a.Elect(ctx, n, "a", &dlock.Options{TTL: ttl, NoRefresh: true})
		if err != nil {
			return Latency{}, err
		}
		elected := time.Now()
		next, err := b.Elect(ctx, n, "b", &dlock.Options{TTL: ttl})
		if err != nil {
			return Latency{}, err
		}
		at := time.Now()
		if _, ok := lead.Fence(); !ok {
			return Latency{}, errors.New("a leadership without a term")
		}
		*granted = lead.TTL()
		samples = append(samples, at.Sub(elected))
		if err := next.Release(ctx); err != nil {
			return Latency{}, err
		}
		_ = lead.Release(ctx) // lost by now: ErrNotHeld
	}
	return Summarize(samples, time.Since(start)), nil
}

// resignSettle is how long the candidate is given to queue behind the
// leader before the leader resigns.
const resignSettle = 100 * time.Millisecond

// resign times cfg.Failover clean handovers: a leader resigns (its
// Release, as a process does on shutdown) while a candidate waits in
// Elect; each sample runs from the Release's return to the candidate's
// Elect returning: what a notified wait costs, not a TTL.
func resign(ctx context.Context, cfg PrimConfig, t PrimTarget, name string, ttl time.Duration) (Latency, error) {
	a, b, err := twoLockers(ctx, t)
	if err != nil {
		return Latency{}, err
	}
	defer closeLocker(a)
	defer closeLocker(b)
	var samples []time.Duration
	start := time.Now()
	for i := range cfg.Failover {
		n := fmt.Sprintf("%s:%d", name, i)
		lead, err := a.Elect(ctx, n, "a", &dlock.Options{TTL: ttl})
		if err != nil {
			return Latency{}, err
		}
		type elected struct {
			ls  *dlock.Lease
			at  time.Time
			err error
		}
		c := make(chan elected, 1)
		go func() {
			ls, err := b.Elect(ctx, n, "b", &dlock.Options{TTL: ttl})
			c <- elected{ls, time.Now(), err}
		}()
		select {
		case e := <-c:
			_ = lead.Release(ctx)
			if e.ls != nil {
				_ = e.ls.Release(ctx)
			}
			return Latency{}, fmt.Errorf("the candidate was elected while the leader led: %v", e.err)
		case <-time.After(resignSettle):
		}
		if err := lead.Release(ctx); err != nil {
			<-c
			return Latency{}, err
		}
		resigned := time.Now()
		e := <-c
		if e.err != nil {
			return Latency{}, e.err
		}
		samples = append(samples, max(e.at.Sub(resigned), 0))
		if err := e.ls.Release(ctx); err != nil {
			return Latency{}, err
		}
	}
	return Summarize(samples, time.Since(start)), nil
}

// twoLockers opens the leader's and the candidate's Lockers.
func twoLockers(ctx context.Context, t PrimTarget) (a, b *dlock.Locker, err error) {
	if a, err = t.Open(ctx); err != nil {
		return nil, nil, err
	}
	if b, err = t.Open(ctx); err != nil {
		closeLocker(a)
		return nil, nil, err
	}
	return a, b, nil
}

func closeLocker(l *dlock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = l.Close(ctx)
}

// WritePrimitivesText writes the results as a table.
func WritePrimitivesText(w io.Writer, cfg PrimConfig, results []PrimResult) error {
	cfg = cfg.withDefaults()
	fmt.Fprintf(w, "dlock bench primitives: %d samples each; semaphore limit %d, %d workers for %v; %d failovers\n\n",
		cfg.N, cfg.Limit, cfg.Workers, cfg.Duration, cfg.Failover)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tpermit p50\tp99\tpermits/s\tread p50\tp99\tfailover p50\tp99\tleader TTL\tresign p50\tp99")
	dash := func(l *Latency, p99 bool) string {
		switch {
		case l == nil:
			return "-"
		case p99:
			return FormatDuration(l.P99)
		}
		return FormatDuration(l.P50)
	}
	for _, r := range results {
		ops, ttl := "-", "-"
		if r.SemaphoreOps > 0 {
			ops = formatOps(r.SemaphoreOps)
		}
		if r.Failover != nil {
			ttl = r.FailoverTTL.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Backend,
			dash(r.Semaphore, false), dash(r.Semaphore, true), ops,
			dash(r.Read, false), dash(r.Read, true),
			dash(r.Failover, false), dash(r.Failover, true), ttl,
			dash(r.Resign, false), dash(r.Resign, true))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\npermit: Semaphore.Acquire + Release, nobody else waiting; permits/s: that with the workers\n"+
		"(each its own Locker) sharing one semaphore. read: RWLock.RLock + Release. failover: from a leader's\n"+
		"grant (it never refreshes: its process stopped) to the waiting candidate's Elect returning; compare with\n"+
		"the leader's TTL. resign: from a leader's Release (a clean shutdown) to the waiting candidate's Elect\n"+
		"returning. '-': not measured: the backend does not offer the primitive (\"no ...\" below) or\n"+
		"the measurement failed (ERROR below).")
	fmt.Fprintln(w, "\nAcquireAll of k names + Release, against k single Acquire calls one after another + k Releases\n"+
		"(one Locker, nobody else on the names):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tk\tAcquireAll p50\tp99\tk singles p50\tp99\tratio (p50)")
	for _, r := range results {
		for _, f := range r.All {
			ratio := "-"
			if f.Singles.P50 > 0 {
				ratio = fmt.Sprintf("%.2f×", float64(f.All.P50)/float64(f.Singles.P50))
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Backend, f.K, FormatDuration(f.All.P50), FormatDuration(f.All.P99),
				FormatDuration(f.Singles.P50), FormatDuration(f.Singles.P99), ratio)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		for _, u := range r.Unsupported {
			fmt.Fprintf(w, "%s: no %s\n", r.Backend, u)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(w, "ERROR %s %s\n", r.Backend, e)
		}
	}
	return nil
}
