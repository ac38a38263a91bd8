package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
)

// benchPrimMain is `dlock bench primitives`.
func benchPrimMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock bench primitives", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.PrimConfig
	// Every backend, those lacking every primitive too: their row of '-'
	// says so.
	list := fs.String("backends", strings.Join(backendNames(), ","), "comma-separated `list` of backends")
	urls := urlFlag{}
	fs.Var(urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable)")
	fs.IntVar(&cfg.N, "n", 200, "acquire+release samples")
	fs.DurationVar(&cfg.Duration, "duration", time.Second, "length of the semaphore throughput turn")
	fs.IntVar(&cfg.Workers, "workers", 8, "workers sharing the semaphore, each with its own Locker")
	fs.IntVar(&cfg.Limit, "limit", 3, "the semaphore's limit")
	fs.IntVar(&cfg.Failover, "failovers", 5, "leader failovers timed")
	fs.DurationVar(&cfg.TTL, "ttl", 0, "leaders' TTL in the failovers (default the larger of 1s and the backend's MinTTL)")
	quiet := fs.Bool("q", false, "no progress on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: dlock bench primitives [flags]

Measures semaphores, read/write locks and leader election on each backend
that offers them: a permit's acquire+release p50/p99, permits/s with
-workers workers sharing a semaphore of -limit, a read lock's
acquire+release, leader failover time (from a leader that stops
refreshing to the next candidate's Elect returning) against the leaders'
TTL, the handover time of a leader that resigns (from its Release to the
waiting candidate's Elect returning), and AcquireAll of 2, 5 and 20 names against as many single
acquisitions. Servers are started in Docker on 127.0.0.1 unless -url names one.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	names, ok := benchNames("dlock bench primitives", *list, anyBackend, stderr)
	if !ok {
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench primitives: removing servers: %v\n", err)
		}
	}()
	ts, code := startBenchTargets(ctx, "dlock bench primitives", names, urls, nil, cfg.Progress, stderr)
	if code != 0 {
		return code
	}
	var targets []bench.PrimTarget
	for _, t := range ts {
		raw := t.raw
		targets = append(targets, bench.PrimTarget{Backend: t.name, URL: driver.RedactURL(t.u),
			Open: func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) }})
	}
	results := bench.RunPrimitives(ctx, cfg, targets)
	if err := bench.WritePrimitivesText(stdout, cfg, results); err != nil {
		fmt.Fprintf(stderr, "dlock bench primitives: %v\n", err)
		return 1
	}
	for _, r := range results {
		if len(r.Errors) > 0 {
			return 1
		}
	}
	return 0
}
