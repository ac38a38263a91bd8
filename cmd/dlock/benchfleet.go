package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/driver"
)

// fleetURLEnv passes the backend's URL to a fleet member: in the
// environment, not in its arguments, where ps shows a password.
const fleetURLEnv = "DLOCK_FLEET_URL"

// benchFleetMain is `dlock bench fleet`.
func benchFleetMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock bench fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.FleetConfig
	list := fs.String("backends", "redis,etcd,zookeeper,postgres", "comma-separated `list` of backends")
	urls := urlFlag{}
	fs.Var(urls, "url", "use the server at `name=URL` for backend name instead of starting one (repeatable)")
	ps := fs.String("p", "1,10,50,100", "comma-separated fleet `sizes`: processes with a Locker each, the measuring one included")
	fs.IntVar(&cfg.N, "n", 300, "acquire+release cycles measured at each size")
	fs.IntVar(&cfg.Hold, "hold", 0, "leases each member process holds while the fleet is idle")
	fs.DurationVar(&cfg.Idle, "idle", 15*time.Second, "how long the fleet sits idle before each measurement")
	quiet := fs.Bool("q", false, "no progress on stderr")
	out := fs.String("o", "", "also write the table to `file`: .md for Markdown, .json for JSON, .txt for text")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: dlock bench fleet [flags]

Measures what a fleet costs: the replicas of a service each run a Locker on
one backend. For each size P it starts P-1 member processes, each opening a
Locker that takes and releases a lock of its own (and holds -hold leases),
lets them sit idle for -idle, then times one process's TryAcquire+Release
on a name of its own. Per backend and P it reports p50 and p99 and their
ratio to P=1, the servers' CPU per operation, their memory, the machine's
connections to them, the watches or subscriptions the server keeps (etcd,
redis, zookeeper) and the held leases lost.

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
	prev := 0
	for s := range strings.SplitSeq(*ps, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p <= prev {
			fmt.Fprintf(stderr, "dlock bench fleet: -p: want ascending positive sizes, not %q\n", *ps)
			return 2
		}
		cfg.Ps = append(cfg.Ps, p)
		prev = p
	}
	if cfg.N <= 0 || cfg.Hold < 0 || cfg.Idle <= 0 {
		fmt.Fprintln(stderr, "dlock bench fleet: -n and -idle must be positive, -hold not negative")
		return 2
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	format := ""
	if *out != "" {
		var err error
		if format, err = bench.FormatFor(*out); err != nil || format == bench.FormatHTML {
			fmt.Fprintf(stderr, "dlock bench fleet: -o: want a .md, .json or .txt file, not %q\n", *out)
			return 2
		}
	}
	names, ok := benchNames("dlock bench fleet", *list, func(n string) error {
		if n == "memory" {
			return errors.New("memory lives in one process: a fleet needs a server")
		}
		return anyBackend(n)
	}, stderr)
	if !ok {
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "dlock bench fleet: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := dlocktest.CloseAll(); err != nil {
			fmt.Fprintf(stderr, "dlock bench fleet: removing servers: %v\n", err)
		}
	}()
	ts, code := startBenchTargets(ctx, "dlock bench fleet", names, urls, urlFlag{}, cfg.Progress, stderr)
	if code != 0 {
		return code
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	memberErr := &syncWriter{w: stderr} // the members write to it at once
	var targets []bench.FleetTarget
	for _, t := range ts {
		raw := t.raw
		targets = append(targets, bench.FleetTarget{Backend: t.name, URL: driver.RedactURL(t.u), Addrs: t.addrs,
			Open: func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) },
			StartMember: func(ctx context.Context, i int) (bench.Member, error) {
				return startMember(ctx, exe, raw, fmt.Sprintf("dlock-bench-fleet/%s/%d", run, i), cfg.Hold, memberErr)
			},
			Watches:      watchCounter(t),
			ServerCPU:    t.serverCPU(),
			ServerMemory: t.serverMemory(),
		})
	}
	results := bench.RunFleet(ctx, cfg, targets)
	if err := bench.WriteFleet(stdout, bench.FormatText, cfg, results); err != nil {
		fmt.Fprintf(stderr, "dlock bench fleet: %v\n", err)
		return 1
	}
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error { return bench.WriteFleet(w, format, cfg, results) }); err != nil {
			fmt.Fprintf(stderr, "dlock bench fleet: -o: %v\n", err)
			return 1
		}
	}
	for _, r := range results {
		if len(r.Errors) > 0 || r.Lost > 0 {
			return 1
		}
	}
	return 0
}

// startMember starts a fleet member: this program's `bench fleet-member`.
func startMember(ctx context.Context, exe, url, name string, hold int, stderr io.Writer) (bench.Member, error) {
	cmd := exec.Command(exe, "bench", "fleet-member", "-name", name, "-hold", strconv.Itoa(hold))
	cmd.Env = append(os.Environ(), fleetURLEnv+"="+url)
	cmd.Stderr = stderr
	cmd.SysProcAttr = hogAttr() // ends with this process
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &bench.ProcessMember{In: in, Out: bufio.NewReader(out), Wait: cmd.Wait}, nil
}

// benchFleetMemberMain is `dlock bench fleet-member`, a member process of
// `dlock bench fleet` (not for direct use): the URL comes in
// DLOCK_FLEET_URL, the end of the fleet as the end of stdin.
func benchFleetMemberMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock bench fleet-member", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "the member's lock names' prefix")
	hold := fs.Int("hold", 0, "leases to hold")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	raw := os.Getenv(fleetURLEnv)
	if raw == "" || *name == "" {
		fmt.Fprintln(stderr, "dlock bench fleet-member: a member of dlock bench fleet, which sets -name and "+fleetURLEnv)
		return 2
	}
	open := func(ctx context.Context) (*dlock.Locker, error) { return dlock.Open(ctx, raw) }
	if err := bench.RunFleetMember(ctx, open, *name, *hold, os.Stdin, stdout); err != nil {
		u, _ := url.Parse(raw)
		fmt.Fprintf(stderr, "dlock bench fleet-member: %v\n", driver.RedactText(err.Error(), u))
		fmt.Fprintln(stdout, "error")
		return 1
	}
	return 0
}

// watchCounter counts what t's server keeps per client for notifications,
// where the backend tells: etcd's watchers (its metrics), Redis's channel
// and pattern subscriptions, ZooKeeper's watches (mntr). nil otherwise.
func watchCounter(t benchTarget) func(context.Context) (int, error) {
	if len(t.addrs) != 1 {
		return nil
	}
	addr := t.addrs[0]
	switch t.name {
	case "etcd":
		return func(ctx context.Context) (int, error) { return etcdWatchers(ctx, addr) }
	case "redis":
		opts, err := goredis.ParseURL(t.raw)
		if err != nil {
			return nil
		}
		return func(ctx context.Context) (int, error) { return redisSubscriptions(ctx, opts) }
	case "zookeeper":
		return func(ctx context.Context) (int, error) { return zkWatches(ctx, addr) }
	}
	return nil
}

func etcdWatchers(ctx context.Context, addr string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, errors.New("no watcher count in the metrics")
}

func redisSubscriptions(ctx context.Context, opts *goredis.Options) (int, error) {
	c := goredis.NewClient(opts)
	defer c.Close()
	chans, err := c.PubSubChannels(ctx, "*").Result()
	if err != nil {
		return 0, err
	}
	n, err := c.PubSubNumPat(ctx).Result()
	if err != nil {
		return 0, err
	}
	if len(chans) > 0 {
		subs, err := c.PubSubNumSub(ctx, chans...).Result()
		if err != nil {
			return 0, err
		}
		for _, k := range subs {
			n += k
		}
	}
	return int(n), nil
}

func zkWatches(ctx context.Context, addr string) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "mntr"); err != nil {
		return 0, err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "zk_watch_count"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no zk_watch_count in mntr")
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
