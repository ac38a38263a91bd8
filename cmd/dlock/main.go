// Command dlock is dlock's command-line tool.
//
// Usage:
//
//	dlock bench [flags]   compare lock backends, dlock against each raw client
//	dlock run [flags] NAME -- COMMAND [ARG...]
//	                      run a command while holding a lock
//	dlock inspect [-json] URL [NAME | -prefix P]
//	                      show who holds a lock and who waits
//	dlock steal [-yes] URL NAME
//	                      take a stuck lock over, telling its holder
//	dlock version         show dlock's version, commit and Go version
//	dlock help [command]  show help
//
// See `dlock help bench` for the benchmark's flags and what it measures,
// and `dlock help run` for running a command under a lock and its exit
// statuses.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/redis/go-redis/v9/logging"
)

func main() {
	// dlock reports every error itself; go-redis's process-wide logger
	// would repeat them (a failed dial) on stderr, between a command's own
	// lines under dlock run. The library leaves that logger to the
	// application; this one turns it off.
	logging.Disable()
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command; it returns the exit status: 0 on success, 1 when
// a run failed, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "bench":
		return benchMain(ctx, rest, stdout, stderr)
	case "run":
		return runMain(ctx, rest, stdout, stderr)
	case "inspect":
		return inspectMain(ctx, rest, stdout, stderr)
	case "steal":
		return stealMain(ctx, rest, os.Stdin, stdout, stderr)
	case "version", "-version", "--version":
		return versionMain(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			usage(stdout)
			return 0
		}
		switch rest[0] {
		case "bench":
			fs, _ := benchFlagSet(stdout)
			fs.Usage()
			return 0
		case "run":
			return runMain(ctx, []string{"-h"}, stdout, stdout)
		case "inspect":
			return inspectMain(ctx, []string{"-h"}, stdout, stdout)
		case "steal":
			return stealMain(ctx, []string{"-h"}, nil, stdout, stdout)
		}
		fmt.Fprintf(stderr, "dlock help: unknown command %q\n", rest[0])
		return 2
	default:
		fmt.Fprintf(stderr, "dlock: unknown command %q\n\n", cmd)
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `dlock is the command-line tool of github.com/dlock/dlock.

Usage:

	dlock bench [flags]   compare lock backends: dlock's driver against the
	                      backend's raw client, on servers it starts itself
	                      (Docker) or on URLs given
	dlock run [flags] NAME -- COMMAND [ARG...]
	                      run COMMAND while holding the lock NAME; it is
	                      killed if the lock is lost (dlock help run)
	dlock inspect [-json] URL [NAME | -prefix P]
	                      show who holds a lock, since when, its TTL left,
	                      fence and waiters (dlock help inspect)
	dlock steal [-yes] URL NAME
	                      break a stuck lock: take it over (its holder
	                      hears it lost) and release it (dlock help steal)
	dlock version         show dlock's version, commit and Go version
	                      (also dlock --version)
	dlock help [command]  show help, e.g. dlock help bench
`)
}
