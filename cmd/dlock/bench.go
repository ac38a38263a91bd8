package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
)

// serverStartTimeout bounds starting one backend's servers, a first image
// build included.
const serverStartTimeout = 10 * time.Minute

type benchOptions struct {
	backends string
	urls     urlFlag
	cfg      bench.Config
	out      string
	html     string
	quiet    bool
	peers    bool
}

func benchFlagSet(output io.Writer) (*flag.FlagSet, *benchOptions) {
	o := &benchOptions{urls: urlFlag{}}
	fs := flag.NewFlagSet("dlock bench", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.backends, "backends", strings.Join(backendNames(), ","), "comma-separated `list` of backends to compare")
	fs.Var(o.urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable)")
	fs.DurationVar(&o.cfg.Duration, "duration", bench.DefaultDuration, "length of each throughput scenario (contended, independent)")
	fs.IntVar(&o.cfg.N, "n", bench.DefaultN, "iterations of the uncontended scenario")
	fs.IntVar(&o.cfg.HandoffN, "handoff-n", bench.DefaultHandoffN, "handoffs measured")
	fs.IntVar(&o.cfg.Workers, "workers", bench.DefaultWorkers, "workers in the contended and independent scenarios, each with its own client")
	fs.DurationVar(&o.cfg.TTL, "ttl", bench.DefaultTTL, "TTL of every lock taken")
	fs.DurationVar(&o.cfg.Settle, "settle", bench.DefaultSettle, "time a handoff waiter is given to reach its wait before the holder releases")
	fs.IntVar(&o.cfg.Rounds, "rounds", bench.DefaultRounds, "turns dlock and the floor take in each scenario, so that both meet the same load")
	fs.StringVar(&o.out, "o", "", "also write the report to `file`: .md for Markdown, .json for JSON, .txt for text")
	fs.StringVar(&o.html, "html", "", "also write the report as one self-contained HTML page (charts included) to `file`")
	fs.BoolVar(&o.peers, "peers", false, "also measure the libraries users would otherwise pick (redsync, redislock, etcd's concurrency.Mutex, zk.Lock, pg_advisory_lock, GET_LOCK) beside dlock and the floor")
	fs.BoolVar(&o.quiet, "q", false, "no progress on stderr (on a terminal it is one line rewritten in place, elsewhere a line per measurement)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, `Usage: dlock bench [flags]

Compares lock backends, each through its dlock driver and through the
backend's raw-client floor (the minimal client calls with no library),
the two taking turns in the same run (-rounds). Backends: %s.
Servers are started in Docker on 127.0.0.1 and removed afterwards, unless
-url names one (or DLOCK_<KIND>_ADDR does; see package dlocktest). On a
server given by -url, the bench takes locks named dlock-bench:<run>:…; the
redis and redlock drivers' fencing counters for those names stay behind.

Scenarios:
  uncontended  one worker: acquire + release, -n times: p50, p99, ops/s
  handoff      a waiter blocked in Acquire for -settle, the holder releases
               at t0, the waiter's Acquire returns at t1: p50/p99 of t1-t0
  contended    -workers workers, each its own client, acquire → release on
               ONE name for -duration: ops/s, fairness = min/max per worker
  independent  the same on one name per worker: ops/s

-peers adds, per backend, the locks of the libraries users would otherwise
pick, measured in the same turns and scenarios, and a table per backend
with dlock, the floor and each peer side by side:
  redis      go-redsync/redsync (one pool), bsm/redislock
  redlock    go-redsync/redsync (one pool per node)
  etcd       go.etcd.io/etcd/client/v3/concurrency.Mutex (a Session each)
  zookeeper  go-zookeeper/zk's zk.Lock
  postgres   pg_advisory_lock / pg_try_advisory_lock through pgx
  mysql      GET_LOCK / RELEASE_LOCK through database/sql (go-sql-driver)
Peers that poll (redsync, redislock) retry every 10ms.

dlock bench queue measures the task queue instead (dlock bench queue -h), and
dlock bench primitives semaphores, read locks and leader failover (dlock bench
primitives -h), dlock bench hold many leases held by one Locker (dlock
bench hold -h), and dlock bench fleet one Locker beside a fleet of idle ones,
each in a process of its own (dlock bench fleet -h).

The table goes to stdout, progress to stderr. -o and -html also write the
report to a file; -html's page is self-contained (its charts included) and
shows the latency distributions, throughputs against each floor, the
settings and the machine.

Flags:
`, strings.Join(backendNames(), ", "))
		fs.PrintDefaults()
	}
	return fs, o
}

// urlFlag collects -url name=URL.
type urlFlag map[string]string

func (u urlFlag) String() string {
	names := make([]string, 0, len(u))
	for n := range u {
		names = append(names, n+"=…")
	}
	slices.Sort(names)
	return strings.Join(names, " ")
}

func (u urlFlag) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	switch {
	case !ok || name == "" || raw == "":
		return errors.New("want name=URL")
	case u[name] != "":
		return fmt.Errorf("-url given twice for %s", name)
	}
	if _, ok := lookupBackend(name); !ok {
		return fmt.Errorf("unknown backend %q (known: %s)", name, strings.Join(backendNames(), ", "))
	}
	u[name] = raw
	return nil
}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "queue" {
		return benchQueueMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "primitives" {
		return benchPrimMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "hold" {
		return benchHoldMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "faults" {
		return benchFaultsMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "fleet" {
		return benchFleetMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "fleet-member" {
		return benchFleetMemberMain(ctx, args[1:], stdout, stderr)
	}
	fs, o := benchFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "dlock bench: "+format+"\n", args...)
		return 2
	}
	if fs.NArg() > 0 {
		return fail("unexpected arguments %q", fs.Args())
	}
	selected, err := selectBackends(o.backends, o.urls)
	if err != nil {
		return fail("%v", err)
	}
	format := ""
	if o.out != "" {
		if format, err = bench.FormatFor(o.out); err != nil {
			return fail("-o: %v", err)
		}
	}
	switch {
	case o.cfg.Duration <= 0, o.cfg.TTL <= 0, o.cfg.N <= 0, o.cfg.HandoffN <= 0, o.cfg.Workers <= 0, o.cfg.Rounds <= 0, o.cfg.Settle < 0:
		return fail("-duration, -ttl, -n, -handoff-n, -workers and -rounds must be positive, -settle not negative")
	}
	if !o.quiet {
		p := newProgress(stderr)
		defer p.Close()
		o.cfg.Progress = p
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first interrupt the default handling is back: a second one
	// kills at once (servers left behind are removed by the next run).
	context.AfterFunc(ctx, stop)
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench: removing servers: %v\n", err)
		}
	}()

	targets, err := prepareTargets(ctx, selected, o.urls, o.peers, o.cfg.Progress)
	if err != nil {
		fmt.Fprintf(stderr, "dlock bench: %v\n", err)
		return 1
	}
	rep, err := bench.Run(ctx, o.cfg, targets)
	if p, ok := o.cfg.Progress.(*progressWriter); ok {
		p.Close() // before the table
	}
	if rep != nil && len(rep.Backends) > 0 {
		if werr := rep.WriteText(stdout); werr != nil {
			fmt.Fprintf(stderr, "dlock bench: %v\n", werr)
			return 1
		}
		if o.out != "" {
			if werr := writeReport(o.out, format, rep); werr != nil {
				fmt.Fprintf(stderr, "dlock bench: %v\n", werr)
				return 1
			}
		}
		if o.html != "" {
			if werr := writeReport(o.html, bench.FormatHTML, rep); werr != nil {
				fmt.Fprintf(stderr, "dlock bench: %v\n", werr)
				return 1
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = errors.New("interrupted: the table shows what was measured before")
		}
		fmt.Fprintf(stderr, "dlock bench: %v\n", err)
		return 1
	}
	if err := rep.Err(); err != nil {
		fmt.Fprintf(stderr, "dlock bench: some scenarios failed:\n%v\n", err)
		return 1
	}
	return 0
}

// selectBackends resolves -backends against the table; every -url must name
// a selected backend.
func selectBackends(list string, urls urlFlag) ([]backend, error) {
	var out []backend
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		b, ok := lookupBackend(name)
		if !ok {
			return nil, fmt.Errorf("-backends: unknown backend %q (known: %s)", name, strings.Join(backendNames(), ", "))
		}
		if slices.ContainsFunc(out, func(o backend) bool { return o.name == name }) {
			return nil, fmt.Errorf("-backends: %s given twice", name)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, errors.New("-backends: no backend selected")
	}
	for name := range urls {
		if !slices.ContainsFunc(out, func(o backend) bool { return o.name == name }) {
			return nil, fmt.Errorf("-url given for %s, which is not in -backends", name)
		}
	}
	return out, nil
}

// prepareTargets starts the servers each backend needs (unless its URL is
// given) and makes its bench target.
func prepareTargets(ctx context.Context, selected []backend, urls urlFlag, peers bool, progress io.Writer) ([]bench.Target, error) {
	say := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", args...)
		}
	}
	targets := make([]bench.Target, 0, len(selected))
	for _, b := range selected {
		raw, given := urls[b.name]
		if !given {
			addrs := make([]string, 0, len(b.servers))
			for _, kind := range b.servers {
				say("%-8s starting a server (%s)…", b.name, kind)
				sctx, cancel := context.WithTimeout(ctx, serverStartTimeout)
				srv, err := dlocktest.Start(sctx, kind, nil)
				cancel()
				if err != nil {
					return nil, fmt.Errorf("%s: %w", b.name, err)
				}
				if !srv.External() && !loopback(srv.Addr()) {
					return nil, fmt.Errorf("%s: server at %s is not on 127.0.0.1", b.name, srv.Addr())
				}
				say("%-8s %s", b.name, srv)
				addrs = append(addrs, srv.Addr())
			}
			raw = b.url(addrs)
		}
		t, err := newTarget(b, raw, peers)
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	return targets, nil
}

// newTarget makes the bench target of backend b at raw, with its peers when
// peers is set.
func newTarget(b backend, raw string, peers bool) (bench.Target, error) {
	u, err := parseURL(raw)
	if err != nil {
		return bench.Target{}, fmt.Errorf("%s: %w", b.name, err)
	}
	floor, err := b.floor(u)
	if err != nil {
		return bench.Target{}, fmt.Errorf("%s: %w (URL %s)", b.name, err, driver.RedactURL(u))
	}
	t := bench.Target{
		Backend: b.name,
		URL:     driver.RedactURL(u),
		Open:    func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) },
		Floor:   floor,
	}
	if peers && b.peers != nil {
		if t.Peers, err = b.peers(u); err != nil {
			return bench.Target{}, fmt.Errorf("%s: %w (URL %s)", b.name, err, driver.RedactURL(u))
		}
	}
	return t, nil
}

func writeReport(path, format string, rep *bench.Report) error {
	return writeFile(path, func(w io.Writer) error { return rep.Write(w, format) })
}

// parseURL parses a backend URL as dlock.Open does, without repeating any
// of its userinfo in an error (see driver.ParseURL).
func parseURL(raw string) (*url.URL, error) {
	u, err := driver.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("URL %s has no scheme", driver.RedactURL(u))
	}
	return u, nil
}
