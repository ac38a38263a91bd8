package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

const stealUsage = `Usage: dlock steal [-yes] URL NAME

Breaks a stuck lock, telling its holder: takes the lock NAME over at once,
whoever holds it, then releases it, so that the first waiter gets it. The
holder's lease ends as lost with an error saying it was taken over (at once
where the backend notifies it, else at its next refresh); its later writes
carry a lower fence than any new holder's, so a fenced resource refuses
them. Shows who held the lock before and who holds it after, as
dlock inspect does.

On a terminal it asks for confirmation; elsewhere -yes is required.

Flags:
`

// stealMain is `dlock steal`.
func stealMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock steal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), stealUsage)
		fs.PrintDefaults()
	}
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) != 2 {
		fmt.Fprintln(stderr, "dlock steal: want a URL and a NAME")
		fmt.Fprintln(stderr, "usage: dlock steal [-yes] URL NAME")
		return exitUsage
	}
	rawURL, name := pos[0], pos[1]
	if err := dlock.ValidateName(name); err != nil {
		fmt.Fprintf(stderr, "dlock steal: %v\n", err)
		return exitUsage
	}
	if !*yes && !isTerminal(stdin) {
		fmt.Fprintln(stderr, "dlock steal: standard input is not a terminal to confirm on: give -yes")
		return exitUsage
	}
	u, _ := url.Parse(rawURL)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	l, closeLocker, code := openLocker(ctx, "dlock steal", rawURL, stderr)
	if l == nil {
		return code
	}
	defer closeLocker()
	if !l.Capabilities().Steal {
		fmt.Fprintf(stderr, "dlock steal: this backend cannot take a lock over (%v)\n", errors.ErrUnsupported)
		return exitFailed
	}
	show := func(when string) {
		info, err := l.Inspect(ctx, name)
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			return
		case err != nil:
			fmt.Fprintf(stderr, "dlock steal: inspecting %q %s: %v\n", name, when, driver.RedactError(err, u))
			return
		}
		fmt.Fprintf(stdout, "%s:\n", when)
		writeTable(stdout, []dlock.LockInfo{info}, time.Now())
	}
	show("before")
	if !*yes {
		fmt.Fprintf(stdout, "Take %q over and release it? [y/N] ", name)
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(stderr, "dlock steal: not confirmed; nothing done")
			return exitFailed
		}
	}
	ls, err := l.Steal(ctx, name, nil)
	if err != nil {
		fmt.Fprintf(stderr, "dlock steal: %v\n", driver.RedactError(err, u))
		return exitFailed
	}
	f, hasFence := ls.Fence()
	if err := ls.Release(ctx); err != nil {
		fmt.Fprintf(stderr, "dlock steal: took %q over but could not release it (it expires at its TTL): %v\n", name, driver.RedactError(err, u))
		return exitFailed
	}
	if hasFence {
		fmt.Fprintf(stdout, "took %q over with fence %d and released it\n", name, f)
	} else {
		fmt.Fprintf(stdout, "took %q over and released it\n", name)
	}
	show("after")
	return 0
}
