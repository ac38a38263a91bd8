package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

const inspectUsage = `Usage: dlock inspect [-json] URL [NAME | -prefix P]

Shows who holds a lock and who waits for it, as the backend sees it: the
holder (the first 8 hex digits of its token, its metadata, the backend's
name for it), since when, the time left before it expires unless refreshed,
its fencing token, and the number of waiters. With -prefix, every name in
use that begins with P ("" for all; not every backend can list names).
A column the backend cannot tell shows "-".

Flags:
`

// inspectMain is `dlock inspect`.
func inspectMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), inspectUsage)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print JSON (an array of objects) instead of a table")
	prefix := fs.String("prefix", "", "describe every name in use with this prefix")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	// Flags may come after the URL and name too.
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
	prefixSet := false
	fs.Visit(func(f *flag.Flag) { prefixSet = prefixSet || f.Name == "prefix" })
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "dlock inspect: "+format+"\n", a...)
		fmt.Fprintln(stderr, "usage: dlock inspect [-json] URL [NAME | -prefix P]")
		return exitUsage
	}
	switch {
	case len(pos) == 0:
		return usageErr("no URL")
	case len(pos) > 2:
		return usageErr("unexpected arguments %q", pos[2:])
	case len(pos) == 2 && prefixSet:
		return usageErr("give a NAME or -prefix, not both")
	case len(pos) == 1 && !prefixSet:
		prefixSet = true // every name
	}
	rawURL := pos[0]
	u, _ := url.Parse(rawURL)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	l, closeLocker, code := openLocker(ctx, "dlock inspect", rawURL, stderr)
	if l == nil {
		return code
	}
	defer closeLocker()
	var infos []dlock.LockInfo
	var err error
	if prefixSet {
		infos, err = l.InspectPrefix(ctx, *prefix)
	} else {
		var info dlock.LockInfo
		info, err = l.Inspect(ctx, pos[1])
		infos = []dlock.LockInfo{info}
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlock inspect: %v\n", driver.RedactError(err, u))
		if errors.Is(err, dlock.ErrInvalid) {
			return exitUsage
		}
		return exitFailed
	}
	if *asJSON {
		return writeJSON(stdout, stderr, infos)
	}
	writeTable(stdout, infos, time.Now())
	return 0
}

// lockJSON is a LockInfo in JSON: unknown fields are omitted.
type lockJSON struct {
	Name     string     `json:"name"`
	Held     bool       `json:"held"`
	Token    string     `json:"token_prefix,omitempty"`
	Metadata string     `json:"metadata,omitempty"`
	Holder   string     `json:"holder,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	TTLms    *int64     `json:"ttl_ms,omitempty"`
	Fence    *uint64    `json:"fence,omitempty"`
	Waiters  *int       `json:"waiters,omitempty"`
}

func writeJSON(stdout, stderr io.Writer, infos []dlock.LockInfo) int {
	out := make([]lockJSON, 0, len(infos))
	for _, in := range infos {
		j := lockJSON{Name: in.Name, Held: in.Held, Token: in.Token, Metadata: in.Metadata, Holder: in.Holder}
		if !in.Since.IsZero() {
			s := in.Since.UTC()
			j.Since = &s
		}
		if in.TTL >= 0 && in.Held {
			ms := in.TTL.Milliseconds()
			j.TTLms = &ms
		}
		if in.HasFence && in.Held {
			f := in.Fence
			j.Fence = &f
		}
		if in.Waiters >= 0 {
			w := in.Waiters
			j.Waiters = &w
		}
		out = append(out, j)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "dlock inspect: %v\n", err)
		return exitFailed
	}
	return 0
}

func writeTable(w io.Writer, infos []dlock.LockInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHELD\tTOKEN\tHOLDER\tMETADATA\tSINCE\tTTL LEFT\tFENCE\tWAITERS")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, in := range infos {
		since, ttl, fence, waiters := "-", "-", "-", "-"
		if !in.Since.IsZero() {
			since = in.Since.UTC().Format(time.RFC3339) + " (" + now.Sub(in.Since).Round(time.Second).String() + " ago)"
		}
		if in.Held && in.TTL >= 0 {
			ttl = in.TTL.Round(time.Millisecond).String()
		}
		if in.Held && in.HasFence {
			fence = strconv.FormatUint(in.Fence, 10)
		}
		if in.Waiters >= 0 {
			waiters = strconv.Itoa(in.Waiters)
		}
		held := "no"
		if in.Held {
			held = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Name, held, dash(in.Token), dash(in.Holder),
			dash(printable(in.Metadata)), since, ttl, fence, waiters)
	}
	tw.Flush()
}

// printable escapes what a terminal would interpret (metadata is the
// application's).
func printable(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
