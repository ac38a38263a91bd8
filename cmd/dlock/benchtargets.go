package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

// benchTarget is one backend of a bench subcommand (queue, primitives,
// hold): its URL, and the servers started for it when -url gave none.
type benchTarget struct {
	name  string
	raw   string   // the URL, with its password
	u     *url.URL // parsed
	addrs []string // the servers' host:port
	srvs  []*dlocktest.Server
}

// benchNames parses a -backends list; known says why a name is refused, or
// returns nil. It reports a refusal on stderr, as cmd's, and returns false.
func benchNames(cmd, list string, known func(string) error, stderr io.Writer) ([]string, bool) {
	var names []string
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if err := known(n); err != nil {
			fmt.Fprintf(stderr, "%s: -backends: %v\n", cmd, err)
			return nil, false
		}
		names = append(names, n)
	}
	return names, true
}

// anyBackend accepts every backend dlock knows.
func anyBackend(n string) error {
	if _, ok := lookupBackend(n); !ok {
		return fmt.Errorf("unknown backend %q (known: %s)", n, strings.Join(backendNames(), ", "))
	}
	return nil
}

// startBenchTargets returns the targets of names: the URL -url gave, or
// servers started here (announced on progress, when not nil), with
// params[name] added to the URL's query. On failure it reports on stderr,
// as cmd's, and returns the exit status (1: a server, 2: a URL).
func startBenchTargets(ctx context.Context, cmd string, names []string, urls, params urlFlag, progress, stderr io.Writer) ([]benchTarget, int) {
	var out []benchTarget
	for _, n := range names {
		b, _ := lookupBackend(n)
		t := benchTarget{name: n}
		raw, given := urls[n]
		if !given {
			for _, kind := range b.servers {
				if progress != nil {
					fmt.Fprintf(progress, "%-9s starting a server (%s)…\n", n, kind)
				}
				sctx, cancel := context.WithTimeout(ctx, serverStartTimeout)
				srv, err := dlocktest.Start(sctx, kind, nil)
				cancel()
				if err != nil {
					fmt.Fprintf(stderr, "%s: %s: %v\n", cmd, n, err)
					return nil, 1
				}
				t.addrs = append(t.addrs, srv.Addr())
				t.srvs = append(t.srvs, srv)
			}
			raw = b.url(t.addrs)
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
			fmt.Fprintf(stderr, "%s: %s: %v\n", cmd, n, err)
			return nil, 2
		}
		if given {
			t.addrs = strings.Split(u.Host, ",")
		}
		t.raw, t.u = raw, u
		out = append(out, t)
	}
	return out, 0
}

// serverCPU reads the total CPU time of the servers started for t, nil when
// t's servers are not ours (-url).
func (t benchTarget) serverCPU() func() (time.Duration, error) {
	return sumServers(t.srvs, (*dlocktest.Server).CPUTime)
}

// serverMemory reads the total memory of the servers started for t, nil
// when t's servers are not ours.
func (t benchTarget) serverMemory() func() (int64, error) {
	return sumServers(t.srvs, (*dlocktest.Server).Memory)
}

// sumServers sums read over srvs; nil when there are none.
func sumServers[T time.Duration | int64](srvs []*dlocktest.Server, read func(*dlocktest.Server) (T, error)) func() (T, error) {
	if len(srvs) == 0 {
		return nil
	}
	return func() (T, error) {
		var sum T
		for _, s := range srvs {
			v, err := read(s)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
}
