package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
)

// benchHoldMain is `dlock bench hold`.
func benchHoldMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock bench hold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.HoldConfig
	list := fs.String("backends", "redis,etcd,zookeeper,postgres", "comma-separated `list` of backends")
	urls := urlFlag{}
	fs.Var(urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable)")
	ns := fs.String("n", "100,1000,10000", "comma-separated `counts` of names held at once")
	params := urlFlag{}
	fs.Var(params, "params", "add `name=k=v&k2=v2` to the URL of backend name (a server started here or -url's), e.g. postgres=shared_sessions=true (repeatable)")
	fs.IntVar(&cfg.Workers, "workers", 16, "goroutines acquiring and releasing")
	fs.DurationVar(&cfg.TTL, "ttl", 3*time.Second, "the leases' TTL")
	fs.DurationVar(&cfg.Hold, "hold", 30*time.Second, "how long all N are held")
	fs.DurationVar(&cfg.Budget, "budget", 60*time.Second, "time allowed to acquire all N")
	fs.IntVar(&cfg.Hogs, "hog", 0, "run `k` CPU-bound processes (busy shell loops) beside the bench for its whole length, as another CPU-heavy process sharing the machine")
	quiet := fs.Bool("q", false, "no progress on stderr")
	out := fs.String("o", "", "also write the table to `file`: .md for Markdown, .json for JSON, .txt for text")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: dlock bench hold [flags]

Measures many leases held by one Locker: for each -n, it takes N distinct
names with -workers goroutines, holds them all for -hold with the watchdog
refreshing, and releases them; per backend and N it reports the time to
acquire and to release, this process's and the server's CPU per minute of
holding, the connections to the server, heap per lease and leases lost.
Servers are started in Docker on 127.0.0.1 unless -url names one.

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
	for s := range strings.SplitSeq(*ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(stderr, "dlock bench hold: -n: %q is not a positive count\n", s)
			return 2
		}
		cfg.Ns = append(cfg.Ns, n)
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	if cfg.Hogs < 0 {
		fmt.Fprintf(stderr, "dlock bench hold: -hog: %d is negative\n", cfg.Hogs)
		return 2
	}
	format := ""
	if *out != "" {
		var err error
		if format, err = bench.FormatFor(*out); err != nil || format == bench.FormatHTML {
			fmt.Fprintf(stderr, "dlock bench hold: -o: want a .md, .json or .txt file, not %q\n", *out)
			return 2
		}
	}
	names, ok := benchNames("dlock bench hold", *list, anyBackend, stderr)
	if !ok {
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench hold: removing servers: %v\n", err)
		}
	}()
	ts, code := startBenchTargets(ctx, "dlock bench hold", names, urls, params, cfg.Progress, stderr)
	if code != 0 {
		return code
	}
	var targets []bench.HoldTarget
	for _, t := range ts {
		raw := t.raw
		targets = append(targets, bench.HoldTarget{Backend: t.name, URL: driver.RedactURL(t.u), Addrs: t.addrs, Advice: holdAdvice(t),
			Open:      func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) },
			ServerCPU: t.serverCPU()})
	}
	stopHogs, err := startHogs(cfg.Hogs)
	if err != nil {
		fmt.Fprintf(stderr, "dlock bench hold: -hog: %v\n", err)
		return 1
	}
	results := bench.RunHold(ctx, cfg, targets)
	stopHogs()
	if err := bench.WriteHoldText(stdout, cfg, results); err != nil {
		fmt.Fprintf(stderr, "dlock bench hold: %v\n", err)
		return 1
	}
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error { return bench.WriteHold(w, format, cfg, results) }); err != nil {
			fmt.Fprintf(stderr, "dlock bench hold: -o: %v\n", err)
			return 1
		}
	}
	status := 0
	for _, r := range results {
		if s := r.Short(); s != "" {
			fmt.Fprintf(stderr, "dlock bench hold: %s\n", s)
		}
		if len(r.Errors) > 0 || r.Lost > 0 || r.Acquired < r.N {
			status = 1
		}
	}
	return status
}

// holdAdvice says what to set for t's backend to hold more leases at once
// than its client allows, or "" when there is nothing to set.
func holdAdvice(t benchTarget) string {
	if t.name != "postgres" {
		return ""
	}
	if v, _ := strconv.ParseBool(t.u.Query().Get("shared_sessions")); v {
		return "raise pool_max_conns (-params postgres=pool_max_conns=N), within the server's max_connections"
	}
	return "without shared sessions each postgres lease holds a connection of the pool: add\n" +
		"shared_sessions=true to the URL (here: -params postgres=shared_sessions=true) to hold many leases on a few\n" +
		"sessions, or raise pool_max_conns within the server's max_connections"
}

// startHogs starts k busy shell loops, each a process of its own that takes
// a core when it gets one; stop kills them and waits for them. The kernel
// kills them too if this process dies first (Pdeathsig).
func startHogs(k int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range k {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		c.SysProcAttr = hogAttr()
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}
