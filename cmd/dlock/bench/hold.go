package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
)

// The hold bench (dlock bench hold): one Locker takes N distinct names with
// Workers goroutines, holds them all (the watchdog refreshing) for Hold,
// then releases them all; per backend and N: the time to acquire and to
// release, the process's and the server's CPU while holding, the
// connections to the server, heap per lease, and leases lost.

// HoldTarget is one backend under test.
type HoldTarget struct {
	Backend string
	URL     string // redacted
	Open    func(ctx context.Context) (*dlock.Locker, error)
	// Addrs are the servers' host:port, whose connections from this process
	// are counted.
	Addrs []string
	// ServerCPU, when not nil, reads the servers' total CPU time.
	ServerCPU func() (time.Duration, error)
	// Advice says what to set for the backend to hold more leases at once
	// (a URL parameter, a server setting): shown with a result that held
	// fewer than N because the client ran out of a resource.
	Advice string
}

// HoldConfig sizes a hold run.
type HoldConfig struct {
	Ns       []int         // default 100, 1000, 10000
	Workers  int           // acquiring and releasing goroutines; default 16
	TTL      time.Duration // default 3s
	Hold     time.Duration // default 30s
	Budget   time.Duration // for acquiring all N; default 60s
	Hogs     int           // CPU-bound processes run beside the bench (reported only)
	Progress io.Writer
}

func (c HoldConfig) withDefaults() HoldConfig {
	if len(c.Ns) == 0 {
		c.Ns = []int{100, 1000, 10000}
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.TTL <= 0 {
		c.TTL = 3 * time.Second
	}
	if c.Hold <= 0 {
		c.Hold = 30 * time.Second
	}
	if c.Budget <= 0 {
		c.Budget = 60 * time.Second
	}
	return c
}

// HoldResult is one backend's figures for one N.
type HoldResult struct {
	Backend string
	N       int
	TTL     time.Duration // the configured one, or the backend's MinTTL if longer
	// Acquired is how many of N were acquired within the budget.
	Acquired int
	// Limited is set when an acquisition failed with
	// dlock.ErrResourceLimit: the Locker cannot hold N leases as
	// configured, and the acquisitions stopped there. Advice is the
	// target's, then.
	Limited bool
	Advice  string
	Acquire time.Duration // to acquire them
	// ProcessCPU and ServerCPU are CPU time per minute of holding (-1 for
	// the server when it cannot be read).
	ProcessCPU, ServerCPU time.Duration
	Conns                 int // connections to the servers while holding
	// HeapPerLease is the heap growth over N, in bytes; 0 when fewer than
	// N were held (a figure over a handful of leases says nothing of N).
	HeapPerLease int64
	Lost         int // leases lost while held
	Release      time.Duration
	Errors       []string
}

// RunHold measures every target at every N.
func RunHold(ctx context.Context, cfg HoldConfig, targets []HoldTarget) []HoldResult {
	cfg = cfg.withDefaults()
	var out []HoldResult
	for _, t := range targets {
		for _, n := range cfg.Ns {
			if ctx.Err() != nil {
				return out
			}
			r := holdOnce(ctx, cfg, t, n)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "%-9s N=%-6d acquired %d in %s, process CPU %s/min, server CPU %s/min, %d conns, %s/lease, lost %d, released in %s\n",
					t.Backend, n, r.Acquired, FormatDuration(r.Acquire), FormatDuration(r.ProcessCPU), cpuText(r.ServerCPU),
					r.Conns, heapText(r), r.Lost, FormatDuration(r.Release))
				for _, e := range r.Errors {
					fmt.Fprintf(cfg.Progress, "%-9s N=%-6d ERROR %s\n", t.Backend, n, e)
				}
			}
			out = append(out, r)
		}
	}
	return out
}

func cpuText(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return FormatDuration(d)
}

func holdOnce(ctx context.Context, cfg HoldConfig, t HoldTarget, n int) HoldResult {
	r := HoldResult{Backend: t.Backend, N: n, ServerCPU: -1}
	fail := func(err error) { r.Errors = append(r.Errors, err.Error()) }
	l, err := t.Open(ctx)
	if err != nil {
		fail(err)
		return r
	}
	defer closeLocker(l)
	r.TTL = max(cfg.TTL, l.Capabilities().MinTTL)
	prefix := "dlock-bench-hold:" + runID() + ":"
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	// Acquire all N with cfg.Workers goroutines, within the budget.
	leases := make([]*dlock.Lease, n)
	actx, cancel := context.WithTimeout(ctx, cfg.Budget)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		emu   sync.Mutex
		first error
	)
	start := time.Now()
	for range cfg.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || actx.Err() != nil {
					return
				}
				ls, err := l.Acquire(actx, prefix+strconv.Itoa(i), &dlock.Options{TTL: r.TTL})
				if err != nil {
					emu.Lock()
					if first == nil && actx.Err() == nil {
						first = err
					}
					if errors.Is(err, dlock.ErrResourceLimit) {
						// Out of connections (or the like): the rest
						// would fail alike until the budget ran out.
						r.Limited = true
						cancel()
					}
					emu.Unlock()
					continue
				}
				leases[i] = ls
			}
		})
	}
	wg.Wait()
	cancel()
	r.Acquire = time.Since(start)
	if first != nil {
		fail(fmt.Errorf("acquire: %w", first))
	}
	for _, ls := range leases {
		if ls != nil {
			r.Acquired++
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if r.Acquired == n {
		r.HeapPerLease = (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(n)
	}
	if r.Limited {
		r.Advice = t.Advice
	}

	// Hold: CPU of the process and the servers over the window.
	cpu0, _ := processCPU()
	srv0, serr := serverCPU(t)
	hold0 := time.Now()
	timer := time.NewTimer(cfg.Hold)
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	timer.Stop()
	held := time.Since(hold0)
	cpu1, _ := processCPU()
	perMinute := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * float64(time.Minute) / float64(held))
	}
	r.ProcessCPU = perMinute(cpu1 - cpu0)
	if srv1, err := serverCPU(t); serr == nil && err == nil {
		r.ServerCPU = perMinute(srv1 - srv0)
	}
	r.Conns = countConns(t.Addrs)
	for _, ls := range leases {
		if ls != nil && ls.Err() != nil {
			r.Lost++
		}
	}

	// Release all, with the same goroutines.
	next.Store(0)
	start = time.Now()
	var rerr atomic.Pointer[error]
	for range cfg.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if ls := leases[i]; ls != nil {
					if err := ls.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
						rerr.CompareAndSwap(nil, &err)
					}
				}
			}
		})
	}
	wg.Wait()
	r.Release = time.Since(start)
	if e := rerr.Load(); e != nil {
		fail(fmt.Errorf("release: %w", *e))
	}
	return r
}

func serverCPU(t HoldTarget) (time.Duration, error) {
	if t.ServerCPU == nil {
		return 0, errors.New("unknown")
	}
	return t.ServerCPU()
}

// processCPU is the process's user and system CPU time so far.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// countConns counts this process's established TCP connections to addrs
// (from /proc/self/net/tcp and tcp6); -1 when they cannot be read.
func countConns(addrs []string) int { return countConnsIn("/proc/self/net", addrs) }

// countAllConns counts the established TCP connections of every process of
// this network namespace to addrs (/proc/net/tcp and tcp6); -1 when they
// cannot be read.
func countAllConns(addrs []string) int { return countConnsIn("/proc/net", addrs) }

// countConnsIn counts the established connections to addrs that dir's tcp
// and tcp6 tables list.
func countConnsIn(dir string, addrs []string) int {
	want := map[string]bool{}
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			continue
		}
		ips, err := net.LookupIP(host)
		if err != nil {
			continue
		}
		for _, ip := range ips {
			want[procAddr(ip, p)] = true
		}
	}
	n, read := 0, false
	for _, f := range []string{dir + "/tcp", dir + "/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		read = true
		for line := range strings.Lines(string(b)) {
			fs := strings.Fields(line)
			if len(fs) > 3 && fs[3] == "01" && want[fs[2]] { // ESTABLISHED, to the server
				n++
			}
		}
	}
	if !read {
		return -1
	}
	return n
}

// procAddr is ip:port as /proc/net/tcp writes it: the address's 32-bit words
// in host (little-endian) order, in hex, then the port.
func procAddr(ip net.IP, port int) string {
	var b strings.Builder
	raw := ip.To4()
	if raw == nil {
		raw = ip.To16()
	}
	for i := 0; i < len(raw); i += 4 {
		fmt.Fprintf(&b, "%02X%02X%02X%02X", raw[i+3], raw[i+2], raw[i+1], raw[i])
	}
	fmt.Fprintf(&b, ":%04X", port)
	return b.String()
}

// WriteHold writes the results in format (FormatText, FormatMarkdown or
// FormatJSON).
func WriteHold(w io.Writer, format string, cfg HoldConfig, results []HoldResult) error {
	switch format {
	case FormatText:
		return WriteHoldText(w, cfg, results)
	case FormatMarkdown:
		return writeHoldMarkdown(w, cfg, results)
	case FormatJSON:
		cfg = cfg.withDefaults()
		out := struct {
			Workers int              `json:"workers"`
			TTL     string           `json:"ttl"`
			Hold    string           `json:"hold"`
			Budget  string           `json:"budget"`
			Hogs    int              `json:"hogs"`
			CPUs    int              `json:"cpus"`
			Results []map[string]any `json:"results"`
			Notes   string           `json:"notes"`
		}{Workers: cfg.Workers, TTL: cfg.TTL.String(), Hold: cfg.Hold.String(), Budget: cfg.Budget.String(),
			Hogs: cfg.Hogs, CPUs: runtime.NumCPU(), Notes: strings.ReplaceAll(holdNotes, "\n", " ")}
		for _, r := range results {
			server := ""
			if r.ServerCPU >= 0 {
				server = r.ServerCPU.String()
			}
			out.Results = append(out.Results, map[string]any{
				"backend": r.Backend, "n": r.N, "ttl": r.TTL.String(), "acquired": r.Acquired,
				"acquire": r.Acquire.String(), "process_cpu_per_min": r.ProcessCPU.String(),
				"server_cpu_per_min": server, "conns": r.Conns, "heap_per_lease_bytes": heapJSON(r), "resource_limit": r.Limited,
				"lost": r.Lost, "release": r.Release.String(), "errors": r.Errors, "advice": r.Advice,
			})
		}
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(out)
	}
	return fmt.Errorf("bench hold: no %s report (want text, Markdown or JSON)", format)
}

const holdNotes = "CPU per minute of holding (process: this one, user+system; server: the containers' cgroups, '-' for\n" +
	"servers not started here). conns: this process's TCP connections to the servers while holding. heap/lease: live\n" +
	"heap growth after the acquisitions over N, '-' when fewer than N were held. lost: leases that ended while held\n" +
	"(must be 0)."

// heapText is a result's heap per lease, "-" when it held fewer than N.
func heapText(r HoldResult) string {
	if r.Acquired < r.N {
		return "-"
	}
	return strconv.FormatInt(r.HeapPerLease, 10) + " B"
}

func heapJSON(r HoldResult) any {
	if r.Acquired < r.N {
		return nil
	}
	return r.HeapPerLease
}

// Short says why a result held fewer than N leases and what to set, or ""
// when it held them all.
func (r HoldResult) Short() string {
	if r.Acquired >= r.N {
		return ""
	}
	s := fmt.Sprintf("%s N=%d: held %d of %d leases", r.Backend, r.N, r.Acquired, r.N)
	switch {
	case r.Limited && r.Advice != "":
		s += ": the client ran out of a resource (ERROR below); to hold more,\n" + r.Advice
	case r.Limited:
		s += ": the client ran out of a resource (ERROR below)"
	default:
		s += " within the budget (-budget)"
	}
	return s
}

func holdHeader(cfg HoldConfig) string {
	h := fmt.Sprintf("one Locker takes N names with %d goroutines (TTL %v or the backend's minimum, watchdog on,\n%v budget), holds them %v, releases them",
		cfg.Workers, cfg.TTL, cfg.Budget, cfg.Hold)
	if cfg.Hogs > 0 {
		h += fmt.Sprintf("\nwith %d CPU-bound processes (busy loops) running beside it on %d cores", cfg.Hogs, runtime.NumCPU())
	}
	return h
}

func writeHoldMarkdown(w io.Writer, cfg HoldConfig, results []HoldResult) error {
	cfg = cfg.withDefaults()
	fmt.Fprintf(w, "# dlock bench hold\n\n%s\n\n", strings.ReplaceAll(holdHeader(cfg), "\n", " "))
	fmt.Fprintln(w, "| backend | N | TTL | acquired | acquire | process CPU/min | server CPU/min | conns | heap/lease | lost | release |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		conns := strconv.Itoa(r.Conns)
		if r.Conns < 0 {
			conns = "-"
		}
		fmt.Fprintf(w, "| %s | %d | %v | %d | %s | %s | %s | %s | %s | %d | %s |\n", r.Backend, r.N, r.TTL, r.Acquired,
			FormatDuration(r.Acquire), FormatDuration(r.ProcessCPU), cpuText(r.ServerCPU), conns, heapText(r), r.Lost,
			FormatDuration(r.Release))
	}
	_, err := fmt.Fprintf(w, "\n%s\n", strings.ReplaceAll(holdNotes, "\n", " "))
	for _, r := range results {
		if s := r.Short(); s != "" {
			fmt.Fprintf(w, "\nSHORT %s\n", s)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(w, "\nERROR %s N=%d %s\n", r.Backend, r.N, e)
		}
	}
	return err
}

// WriteHoldText writes the results as a table.
func WriteHoldText(w io.Writer, cfg HoldConfig, results []HoldResult) error {
	cfg = cfg.withDefaults()
	fmt.Fprintf(w, "dlock bench hold: %s\n\n", holdHeader(cfg))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tN\tTTL\tacquired\tacquire\tprocess CPU/min\tserver CPU/min\tconns\theap/lease\tlost\trelease")
	for _, r := range results {
		conns := strconv.Itoa(r.Conns)
		if r.Conns < 0 {
			conns = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%v\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Backend, r.N, r.TTL, r.Acquired,
			FormatDuration(r.Acquire), FormatDuration(r.ProcessCPU), cpuText(r.ServerCPU), conns, heapText(r), r.Lost,
			FormatDuration(r.Release))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s\n", holdNotes)
	for _, r := range results {
		if s := r.Short(); s != "" {
			fmt.Fprintf(w, "SHORT %s\n", s)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(w, "ERROR %s N=%d %s\n", r.Backend, r.N, e)
		}
	}
	return nil
}
