package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
)

// benchFaultsMain is `dlock bench faults`.
func benchFaultsMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "dlock bench faults"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.FaultsConfig
	list := fs.String("backends", "redis,etcd,zookeeper,postgres,redlock", "comma-separated `list` of backends")
	urls := urlFlag{}
	fs.Var(urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable); only the proxy faults apply to it")
	fs.IntVar(&cfg.Clients, "clients", bench.DefaultFaultsClients, "clients per library, each with its own client and proxies (default 2 with -sanity)")
	fs.DurationVar(&cfg.Duration, "duration", bench.DefaultFaultsDuration, "length of the fault phase of each library's run")
	fs.DurationVar(&cfg.Hold, "hold", bench.DefaultFaultsHold, "how long a holder usually holds the lock")
	fs.DurationVar(&cfg.TTL, "ttl", bench.DefaultFaultsTTL, "the locks' TTL (or the backend's minimum, if longer); the faults' windows scale with it")
	fs.Float64Var(&cfg.Long, "long", bench.DefaultFaultsLong, "fraction of holds that last 1.5×TTL, so that locks are kept alive through faults (0 or less: none)")
	seed := fs.Uint64("seed", 0, "seed of the nemesis's schedule and the clients' choices, to replay a run (0: a new one, printed)")
	fs.BoolVar(&cfg.Sanity, "sanity", false, "harness check: the clients' locks do not exclude each other (a name each; on memory, a store each), so overlaps must show; no peers")
	peers := fs.Bool("peers", true, "also run the libraries users would otherwise pick on each backend (those of dlock bench -peers)")
	asJSON := fs.Bool("json", false, "write the report as JSON on stdout instead of the table")
	out := fs.String("o", "", "also write the report to `file`: .html for a page with a timeline per run, .md for Markdown, .json for JSON, .txt for text")
	quiet := fs.Bool("q", false, "no progress on stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: %s [flags]

Shows what happens to locks when the network or the server misbehaves. Per
backend, and per client library (dlock, then the peers of dlock bench
-peers), -clients clients each with its own client, whose traffic crosses
its own in-process fault proxy, loop on one name: acquire → a write to a
fenced store and to an unfenced log → hold → a write → release, for
-duration, while a nemesis seeded by -seed black-holes, resets and slows
random clients' proxies and, on servers started here, pauses and
restarts servers (redlock: one node, a minority or a majority at once).
Then each client takes the lock once more.

Per backend and library one row: grants, faults by kind, overlaps (two
clients that believed they held the lock at one instant, on this process's
clock), writes the fenced store refused and writes the unfenced log took
out of order, losses reported and not, the loss reports' latency,
recovery after the last heal, the longest time without a grant, and
acquisitions that hung past their ctx. Servers are started in Docker on
127.0.0.1 unless -url names one. -sanity proves the checker sees overlaps.
-o report.html writes a page with a timeline per run: a lane per client,
its held intervals, the fault windows shaded, overlaps in red.

Flags:
`, cmd)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, cmd+": "+format+"\n", args...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return fail("unexpected arguments %q", fs.Args())
	case cfg.Clients <= 0, cfg.Duration <= 0, cfg.Hold <= 0, cfg.TTL <= 0, cfg.Long > 1:
		return fail("-clients, -duration, -hold and -ttl must be positive, -long at most 1")
	case cfg.Sanity && cfg.Clients == 1:
		return fail("-sanity needs at least 2 clients")
	}
	outFormat := ""
	if *out != "" {
		var err error
		if outFormat, err = bench.FormatFor(*out); err != nil {
			return fail("-o: %v", err)
		}
	}
	if cfg.Sanity && !isSet(fs, "clients") {
		cfg.Clients = 2
	}
	if cfg.Seed = *seed; cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()%1e9 + 1
	}
	names, ok := benchNames(cmd, *list, anyBackend, stderr)
	if !ok {
		return 2
	}
	if len(names) == 0 {
		return fail("-backends: no backend selected")
	}
	for n := range urls {
		if !slices.Contains(names, n) {
			return fail("-url given for %s, which is not in -backends", n)
		}
	}
	var progress io.Writer
	if !*quiet {
		progress = stderr
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "%s: removing servers: %v\n", cmd, err)
		}
	}()
	ts, code := startBenchTargets(ctx, cmd, names, urls, nil, progress, stderr)
	if code != 0 {
		return code
	}
	targets := make([]bench.FaultsTarget, 0, len(ts))
	for _, t := range ts {
		ft, err := faultsTarget(t, *peers, cfg.Sanity)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %s: %v\n", cmd, t.name, err)
			return 2
		}
		targets = append(targets, ft)
	}
	if progress != nil {
		fmt.Fprintf(progress, "seed %d (replay with -seed %d)\n", cfg.Seed, cfg.Seed)
	}
	rep := bench.RunFaults(ctx, cfg, targets)
	format := bench.FormatText
	if *asJSON {
		format = bench.FormatJSON
	}
	if err := bench.WriteFaults(stdout, format, rep); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 1
	}
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error { return bench.WriteFaults(w, outFormat, rep) }); err != nil {
			fmt.Fprintf(stderr, "%s: -o: %v\n", cmd, err)
			return 1
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "%s: interrupted: the table shows what was measured before\n", cmd)
		return 1
	}
	status := 0
	for _, row := range rep.Rows {
		if len(row.Errors) > 0 {
			status = 1
		}
		if cfg.Sanity && row.Overlaps == 0 {
			fmt.Fprintf(stderr, "%s: -sanity: %s %s shows no overlap: the checker did not see locks that do not exclude each other\n", cmd, row.Backend, row.Library)
			status = 1
		}
	}
	return status
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// faultsTarget makes the faults bench's target of t: every client reaches
// t's servers through its own proxies, by t's URL with the proxies'
// addresses as hosts.
func faultsTarget(t benchTarget, peers, sanity bool) (bench.FaultsTarget, error) {
	b, _ := lookupBackend(t.name)
	ft := bench.FaultsTarget{Backend: t.name, URL: driver.RedactURL(t.u)}
	if len(b.servers) == 0 {
		// In-process: no network to break. In sanity mode a store each.
		raw := t.raw
		ft.Via = func(client int, _ []string) string {
			if !sanity {
				return raw
			}
			u := *t.u
			u.Host = fmt.Sprintf("%s-sanity-%d", u.Host, client)
			return u.String()
		}
		return ft, nil
	}
	for _, a := range t.addrs {
		if !strings.Contains(a, ":") {
			return ft, fmt.Errorf("the URL's host %q has no port: give it, so that the proxies know where to forward", a)
		}
	}
	ft.Addrs = t.addrs
	u := *t.u
	ft.Via = func(_ int, addrs []string) string {
		v := u
		v.Host = strings.Join(addrs, ",")
		return v.String()
	}
	for _, s := range t.srvs {
		ft.Servers = append(ft.Servers, s)
	}
	if peers && b.peers != nil {
		ft.Peers = func(raw string) ([]bench.Peer, error) {
			pu, err := parseURL(raw)
			if err != nil {
				return nil, err
			}
			return b.peers(pu)
		}
	}
	return ft, nil
}
