package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/bench"
	"github.com/dlock/dlock/internal/servers"
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
	quiet := fs.Bool("q", false, "no progress on stderr")
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
	var names []string
	for n := range strings.SplitSeq(*list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if _, ok := lookupBackend(n); !ok {
			fmt.Fprintf(stderr, "dlock bench hold: -backends: unknown backend %q (known: %s)\n", n, strings.Join(backendNames(), ", "))
			return 2
		}
		names = append(names, n)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := servers.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench hold: removing servers: %v\n", err)
		}
	}()
	var targets []bench.HoldTarget
	for _, n := range names {
		b, _ := lookupBackend(n)
		raw, given := urls[n]
		var (
			addrs []string
			srvs  []*servers.Server
		)
		if !given {
			for _, kind := range b.servers {
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "%-9s starting a %s server…\n", n, kind)
				}
				sctx, cancel := context.WithTimeout(ctx, serverStartTimeout)
				srv, err := servers.Start(sctx, kind, nil)
				cancel()
				if err != nil {
					fmt.Fprintf(stderr, "dlock bench hold: %s: %v\n", n, err)
					return 1
				}
				addrs = append(addrs, srv.Addr())
				srvs = append(srvs, srv)
			}
			raw = b.url(addrs)
		}
		if extra := params[n]; extra != "" {
			sep := "?"
			if strings.Contains(raw, "?") {
				sep = "&"
			}
			raw += sep + extra
		}
		u, err := parseURL(raw)
		if err != nil {
			fmt.Fprintf(stderr, "dlock bench hold: %s: %v\n", n, err)
			return 2
		}
		if given {
			addrs = strings.Split(u.Host, ",")
		}
		t := bench.HoldTarget{Backend: n, URL: driver.RedactURL(u), Addrs: addrs,
			Open: func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) }}
		if len(srvs) > 0 {
			t.ServerCPU = func() (time.Duration, error) {
				var sum time.Duration
				for _, s := range srvs {
					d, err := s.CPUTime()
					if err != nil {
						return 0, err
					}
					sum += d
				}
				return sum, nil
			}
		}
		targets = append(targets, t)
	}
	results := bench.RunHold(ctx, cfg, targets)
	if err := bench.WriteHoldText(stdout, cfg, results); err != nil {
		fmt.Fprintf(stderr, "dlock bench hold: %v\n", err)
		return 1
	}
	for _, r := range results {
		if len(r.Errors) > 0 || r.Lost > 0 || r.Acquired < r.N {
			return 1
		}
	}
	return 0
}
