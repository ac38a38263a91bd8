package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
)

// FleetConfig configures `dlock bench fleet`: one measuring Locker beside a
// fleet of P-1 others, each in a process of its own, as replicas of a
// service share one backend.
type FleetConfig struct {
	// Ps are the fleet sizes, counting the measuring process, ascending.
	// Default 1, 10, 50, 100.
	Ps []int
	// N is how many acquire+release cycles are measured at each size.
	// Default 300.
	N int
	// Hold is how many leases each member holds while idle. Default 0.
	Hold int
	// Idle is how long the fleet sits idle before each measurement, after
	// every member took and released a lock of its own. Default 15s: etcd
	// Lockers stop their watch after 10s without a lock.
	Idle time.Duration
	// Progress, when not nil, receives a line per step.
	Progress io.Writer
}

func (c FleetConfig) withDefaults() FleetConfig {
	if len(c.Ps) == 0 {
		c.Ps = []int{1, 10, 50, 100}
	}
	if c.N <= 0 {
		c.N = 300
	}
	if c.Idle <= 0 {
		c.Idle = 15 * time.Second
	}
	return c
}

// A Member is one process of the fleet.
type Member interface {
	// Ready waits for the member to have taken and released its lock and
	// taken its held leases.
	Ready(ctx context.Context) error
	// Stop asks the member to release everything and exit, and returns how
	// many of its held leases it had lost.
	Stop() (lost int, err error)
}

// FleetTarget is one backend to measure.
type FleetTarget struct {
	Backend string
	URL     string   // redacted, for the report
	Addrs   []string // the servers' addresses
	Open    func(ctx context.Context) (*dlock.Locker, error)
	// StartMember starts member i of the fleet.
	StartMember func(ctx context.Context, i int) (Member, error)
	// ServerCPU and ServerMemory read the servers' CPU time and memory;
	// nil when unknown.
	ServerCPU    func() (time.Duration, error)
	ServerMemory func() (int64, error)
	// Watches counts the watches or subscriptions the server keeps for its
	// clients, where the backend tells (nil otherwise).
	Watches func(ctx context.Context) (int, error)
}

// FleetResult is one fleet size on one backend.
type FleetResult struct {
	Backend string `json:"backend"`
	P       int    `json:"processes"`
	// P50 and P99 are the measuring process's TryAcquire+Release times on a
	// name of its own.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// ServerCPUPerOp is the servers' CPU time per measured cycle, -1 when
	// unknown.
	ServerCPUPerOp time.Duration `json:"server_cpu_per_op_ns"`
	// ServerMemory is the servers' memory in bytes after the measurement,
	// -1 when unknown.
	ServerMemory int64 `json:"server_memory_bytes"`
	// Conns are the established TCP connections from this machine to the
	// servers (every process's), -1 when unknown.
	Conns int `json:"connections"`
	// Watches are the watches or subscriptions the server keeps, -1 when
	// the backend does not tell.
	Watches int `json:"watches"`
	// Lost counts the members' held leases lost (known at the end).
	Lost   int      `json:"lost"`
	Errors []string `json:"errors,omitempty"`
}

// RunFleet measures every target at every fleet size.
func RunFleet(ctx context.Context, cfg FleetConfig, targets []FleetTarget) []FleetResult {
	cfg = cfg.withDefaults()
	var out []FleetResult
	for _, t := range targets {
		out = append(out, fleetOf(ctx, cfg, t)...)
	}
	return out
}

func fleetOf(ctx context.Context, cfg FleetConfig, t FleetTarget) []FleetResult {
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "fleet %s: "+format+"\n", append([]any{t.Backend}, args...)...)
		}
	}
	fail := func(err error) []FleetResult {
		return []FleetResult{{Backend: t.Backend, ServerCPUPerOp: -1, ServerMemory: -1, Conns: -1, Watches: -1, Errors: []string{err.Error()}}}
	}
	me, err := t.Open(ctx)
	if err != nil {
		return fail(err)
	}
	defer me.Close(context.WithoutCancel(ctx))
	var members []Member
	stopAll := func() (lost int, errs []string) {
		for _, m := range members {
			n, err := m.Stop()
			lost += n
			if err != nil {
				errs = append(errs, err.Error())
			}
		}
		members = nil
		return lost, errs
	}
	defer stopAll()

	var results []FleetResult
	for _, p := range cfg.Ps {
		r := FleetResult{Backend: t.Backend, P: p, ServerCPUPerOp: -1, ServerMemory: -1, Conns: -1, Watches: -1}
		for len(members) < p-1 {
			m, err := t.StartMember(ctx, len(members))
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("starting member %d: %v", len(members), err))
				break
			}
			members = append(members, m)
		}
		for i, m := range members {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := m.Ready(rctx)
			cancel()
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("member %d: %v", i, err))
			}
		}
		if len(r.Errors) > 0 || ctx.Err() != nil {
			results = append(results, r)
			break
		}
		progress("%d processes ready; idle for %v", p, cfg.Idle)
		select {
		case <-ctx.Done():
			return results
		case <-time.After(cfg.Idle):
		}
		measure(ctx, cfg, t, me, &r)
		progress("%d processes: p50 %s p99 %s server CPU/op %s", p, FormatDuration(r.P50), FormatDuration(r.P99), cpuText(r.ServerCPUPerOp))
		results = append(results, r)
	}
	lost, errs := stopAll()
	if n := len(results); n > 0 {
		results[n-1].Lost = lost
		results[n-1].Errors = append(results[n-1].Errors, errs...)
	}
	return results
}

// measure times cfg.N TryAcquire+Release cycles of me on a name of its own,
// after a few unmeasured ones, and reads the servers' figures around them.
func measure(ctx context.Context, cfg FleetConfig, t FleetTarget, me *dlock.Locker, r *FleetResult) {
	name := fmt.Sprintf("dlock-bench-fleet/%d/me", time.Now().UnixNano())
	cycle := func() (time.Duration, error) {
		start := time.Now()
		ls, err := me.TryAcquire(ctx, name, nil)
		if err != nil {
			return 0, err
		}
		if err := ls.Release(ctx); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	for range 20 {
		if _, err := cycle(); err != nil {
			r.Errors = append(r.Errors, err.Error())
			return
		}
	}
	cpu0, cpuErr := read(t.ServerCPU)
	ds := make([]time.Duration, 0, cfg.N)
	for range cfg.N {
		d, err := cycle()
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			return
		}
		ds = append(ds, d)
	}
	if cpu1, err := read(t.ServerCPU); err == nil && cpuErr == nil {
		r.ServerCPUPerOp = (cpu1 - cpu0) / time.Duration(cfg.N)
	}
	slices.Sort(ds)
	r.P50, r.P99 = Percentile(ds, 50), Percentile(ds, 99)
	if mem, err := read(t.ServerMemory); err == nil {
		r.ServerMemory = mem
	}
	r.Conns = countAllConns(t.Addrs)
	if t.Watches != nil {
		if n, err := t.Watches(ctx); err == nil {
			r.Watches = n
		}
	}
}

func read[T any](f func() (T, error)) (T, error) {
	var zero T
	if f == nil {
		return zero, errors.New("unknown")
	}
	return f()
}

// ProcessMember is a Member running as a child process that speaks the
// fleet member protocol (RunFleetMember) on its stdin and stdout.
type ProcessMember struct {
	In     io.WriteCloser
	Out    *bufio.Reader
	Wait   func() error
	ready  bool
	closed bool
}

// Ready reads the member's "ready" line.
func (m *ProcessMember) Ready(ctx context.Context) error {
	if m.ready {
		return nil
	}
	line := make(chan string, 1)
	go func() {
		s, err := m.Out.ReadString('\n')
		if err != nil {
			s = "error " + err.Error()
		}
		line <- strings.TrimSpace(s)
	}()
	select {
	case <-ctx.Done():
		return fmt.Errorf("not ready: %w", ctx.Err())
	case s := <-line:
		if s != "ready" {
			return fmt.Errorf("member says %q", s)
		}
		m.ready = true
		return nil
	}
}

// Stop closes the member's stdin, reads its "lost N" line and waits for it.
func (m *ProcessMember) Stop() (int, error) {
	if m.closed {
		return 0, nil
	}
	m.closed = true
	_ = m.In.Close()
	s, rerr := m.Out.ReadString('\n')
	werr := m.Wait()
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(s), "lost "))
	if err != nil {
		return 0, errors.Join(fmt.Errorf("member's last line %q", strings.TrimSpace(s)), rerr, werr)
	}
	return n, werr
}

// RunFleetMember is a fleet member's whole life: it opens a Locker with
// open, takes and releases the lock name+"/once", takes hold leases
// (name+"/held/<i>"), says "ready", and when in ends releases them and says
// "lost N" (how many of them were lost meanwhile).
func RunFleetMember(ctx context.Context, open func(context.Context) (*dlock.Locker, error), name string, hold int, in io.Reader, out io.Writer) error {
	l, err := open(ctx)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	ls, err := l.TryAcquire(ctx, name+"/once", nil)
	if err != nil {
		return err
	}
	if err := ls.Release(ctx); err != nil {
		return err
	}
	held := make([]*dlock.Lease, 0, hold)
	for i := range hold {
		ls, err := l.Acquire(ctx, name+"/held/"+strconv.Itoa(i), nil)
		if err != nil {
			return err
		}
		held = append(held, ls)
	}
	fmt.Fprintln(out, "ready")
	_, _ = io.Copy(io.Discard, in)
	lost := 0
	for _, ls := range held {
		if ls.Err() != nil {
			lost++
			continue
		}
		_ = ls.Release(ctx)
	}
	fmt.Fprintf(out, "lost %d\n", lost)
	return nil
}

// WriteFleet writes the results in format (FormatText, FormatMarkdown or
// FormatJSON).
func WriteFleet(w io.Writer, format string, cfg FleetConfig, results []FleetResult) error {
	cfg = cfg.withDefaults()
	switch format {
	case FormatJSON:
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(struct {
			N       int           `json:"n"`
			Hold    int           `json:"hold_per_member"`
			Idle    time.Duration `json:"idle_ns"`
			Results []FleetResult `json:"results"`
		}{cfg.N, cfg.Hold, cfg.Idle, results})
	case FormatMarkdown:
		fmt.Fprintf(w, "%s\n\n| backend | processes | p50 | p99 | p50 ×P=1 | server CPU/op | CPU ×P=1 | server memory | connections | watches | lost |\n|---|---|---|---|---|---|---|---|---|---|---|\n", fleetHeader(cfg))
		for _, row := range fleetRows(results) {
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
		return nil
	default:
		fmt.Fprintf(w, "dlock bench fleet: %s\n\n", fleetHeader(cfg))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "backend\tprocesses\tp50\tp99\tp50 ×P=1\tserver CPU/op\tCPU ×P=1\tserver memory\tconns\twatches\tlost")
		for _, row := range fleetRows(results) {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, r := range results {
			for _, e := range r.Errors {
				fmt.Fprintf(w, "ERROR %s P=%d %s\n", r.Backend, r.P, e)
			}
		}
		return nil
	}
}

func fleetHeader(cfg FleetConfig) string {
	return fmt.Sprintf("one process's TryAcquire+Release on a name of its own (%d cycles) beside P-1 processes, "+
		"each with a Locker that took and released a lock and holds %d, idle for %v", cfg.N, cfg.Hold, cfg.Idle)
}

func fleetRows(results []FleetResult) [][]string {
	base := map[string]FleetResult{}
	var rows [][]string
	for _, r := range results {
		if r.P == 1 {
			base[r.Backend] = r
		}
		b, ok := base[r.Backend]
		ratio := func(x, y time.Duration) string {
			if !ok || x <= 0 || y <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", float64(x)/float64(y))
		}
		num := func(n int64) string {
			if n < 0 {
				return "-"
			}
			return strconv.FormatInt(n, 10)
		}
		mem := "-"
		if r.ServerMemory >= 0 {
			mem = fmt.Sprintf("%.1f MiB", float64(r.ServerMemory)/(1<<20))
		}
		rows = append(rows, []string{r.Backend, strconv.Itoa(r.P), FormatDuration(r.P50), FormatDuration(r.P99),
			ratio(r.P50, b.P50), cpuText(r.ServerCPUPerOp), ratio(r.ServerCPUPerOp, b.ServerCPUPerOp), mem,
			num(int64(r.Conns)), num(int64(r.Watches)), strconv.Itoa(r.Lost)})
	}
	return rows
}
