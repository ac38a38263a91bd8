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
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/bench"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/queue"
)

// queueBackends are the backends with a task-queue driver, and their floors.
var queueBackends = map[string]func(u *url.URL) func(context.Context) (bench.QueueFloor, error){
	"memory":   nil,
	"redis":    bench.RedisQueueFloor,
	"postgres": bench.PostgresQueueFloor,
}

// benchQueueMain is `dlock bench queue`.
func benchQueueMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock bench queue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.QueueConfig
	list := fs.String("backends", "memory,redis,postgres", "comma-separated `list` of queue backends")
	urls := urlFlag{}
	fs.Var(urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable)")
	fs.DurationVar(&cfg.Duration, "duration", time.Second, "length of each throughput turn")
	fs.IntVar(&cfg.Workers, "workers", 8, "workers, each with its own client")
	fs.IntVar(&cfg.N, "n", 100, "delayed tasks timed from due to claimed")
	fs.DurationVar(&cfg.Delay, "delay", 20*time.Millisecond, "their delay")
	fs.IntVar(&cfg.Rounds, "rounds", 2, "turns of the driver and the floor")
	quiet := fs.Bool("q", false, "no progress on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: dlock bench queue [flags]

Measures the task queue (package queue) on each backend beside a raw-client
floor doing the same work with the fewest server commands: enqueue/s and
claim+ack/s with -workers workers, and how long after a delayed task is due
a worker blocked in ClaimWait has it (p50, p99). Servers are started in
Docker on 127.0.0.1 unless -url names one.

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
	var names []string
	for n := range strings.SplitSeq(*list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if _, ok := queueBackends[n]; !ok {
			fmt.Fprintf(stderr, "dlock bench queue: -backends: %q has no task queue (memory, redis, postgres have)\n", n)
			return 2
		}
		names = append(names, n)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := servers.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench queue: removing servers: %v\n", err)
		}
	}()
	var targets []bench.QueueTarget
	for _, n := range names {
		b, _ := lookupBackend(n)
		raw, given := urls[n]
		if !given {
			var addrs []string
			for _, kind := range b.servers {
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "%-8s starting a %s server…\n", n, kind)
				}
				sctx, cancel := context.WithTimeout(ctx, serverStartTimeout)
				srv, err := servers.Start(sctx, kind, nil)
				cancel()
				if err != nil {
					fmt.Fprintf(stderr, "dlock bench queue: %s: %v\n", n, err)
					return 1
				}
				addrs = append(addrs, srv.Addr())
			}
			raw = b.url(addrs)
		}
		u, err := parseURL(raw)
		if err != nil {
			fmt.Fprintf(stderr, "dlock bench queue: %s: %v\n", n, err)
			return 2
		}
		t := bench.QueueTarget{Backend: n, URL: driver.RedactURL(u),
			Open: func(ctx context.Context) (*queue.Client, error) { return queue.Open(ctx, raw) }}
		if floor := queueBackends[n]; floor != nil {
			t.Floor = floor(u)
		}
		targets = append(targets, t)
	}
	results := bench.RunQueue(ctx, cfg, targets)
	if err := bench.WriteQueueText(stdout, cfg, results); err != nil {
		fmt.Fprintf(stderr, "dlock bench queue: %v\n", err)
		return 1
	}
	for _, r := range results {
		if len(r.Errors) > 0 {
			return 1
		}
	}
	return 0
}
