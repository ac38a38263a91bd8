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
	"syscall"
	"time"

	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/queue"

	// The queue backends the bench can open by URL.
	_ "github.com/dlock/dlock/mysql/mysqlqueue"
	_ "github.com/dlock/dlock/queue/memqueue"
	_ "github.com/dlock/dlock/queue/pgqueue"
	_ "github.com/dlock/dlock/queue/redisqueue"
)

// queueBackends are the backends with a task-queue driver, and their
// floors (none for memory and mysql).
var queueBackends = map[string]func(u *url.URL) func(context.Context) (bench.QueueFloor, error){
	"memory":   nil,
	"mysql":    nil,
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
	peers := fs.Bool("peers", false, "measure hibiken/asynq (redis) and riverqueue/river (postgres) beside dlock's queue instead of the floors")
	quiet := fs.Bool("q", false, "no progress on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: dlock bench queue [flags]

Measures the task queue (package queue) on each backend beside a raw-client
floor doing the same work with the fewest server commands: enqueue/s and
claim+ack/s with -workers workers, and how long after a delayed task is due
a worker blocked in ClaimWait has it (p50, p99). Backends: memory, redis,
postgres (the default list) and mysql (MariaDB, no floor yet). Servers are
started in Docker on 127.0.0.1 unless -url names one.

With -peers it measures, on redis and postgres, dlock's queue beside the
libraries its users would otherwise pick: hibiken/asynq on Redis and
riverqueue/river (riverpgxv5) on PostgreSQL, each in its fast configuration
(printed under the table). Each enqueues for -duration with -workers
goroutines, processes those tasks with -workers workers, and starts -n
tasks due at once (one at a time, the workers idle) and -n delayed -delay,
timed from enqueue to start; with the server's commands (redis) or
transactions (postgres) per task. river's tables go to the schema
dlock_bench_river of the database.

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
	if *peers && *list == "memory,redis,postgres" {
		*list = "redis,postgres"
	}
	names, ok := benchNames("dlock bench queue", *list, func(n string) error {
		if _, ok := queueBackends[n]; !ok {
			return fmt.Errorf("%q has no task queue (memory, redis, postgres, mysql have)", n)
		}
		if *peers && (n == "memory" || n == "mysql") {
			return fmt.Errorf("%s has no peers (-peers measures redis and postgres)", n)
		}
		return nil
	}, stderr)
	if !ok {
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench queue: removing servers: %v\n", err)
		}
	}()
	ts, code := startBenchTargets(ctx, "dlock bench queue", names, urls, nil, cfg.Progress, stderr)
	if code != 0 {
		return code
	}
	if *peers {
		return benchQueuePeers(ctx, cfg, ts, stdout, stderr)
	}
	var targets []bench.QueueTarget
	for _, t := range ts {
		raw := t.raw
		qt := bench.QueueTarget{Backend: t.name, URL: driver.RedactURL(t.u),
			Open: func(ctx context.Context) (*queue.Client, error) { return queue.Open(ctx, raw) }}
		if floor := queueBackends[t.name]; floor != nil {
			qt.Floor = floor(t.u)
		}
		targets = append(targets, qt)
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

// benchQueuePeers is `dlock bench queue -peers`.
func benchQueuePeers(ctx context.Context, qc bench.QueueConfig, ts []benchTarget, stdout, stderr io.Writer) int {
	cfg := bench.QueuePeersConfig{Duration: qc.Duration, Workers: qc.Workers, N: qc.N, Delay: qc.Delay, Progress: qc.Progress}
	var targets []bench.QueuePeerTarget
	for _, t := range ts {
		raw := t.raw
		targets = append(targets, bench.QueuePeerTarget{Backend: t.name, URL: raw, ServerCPU: t.serverCPU(),
			Open: func(ctx context.Context) (*queue.Client, error) { return queue.Open(ctx, raw) }})
	}
	results := bench.RunQueuePeers(ctx, cfg, targets)
	if err := bench.WriteQueuePeersText(stdout, cfg, results); err != nil {
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
