package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Output formats.
const (
	FormatText     = "text"
	FormatMarkdown = "markdown"
	FormatJSON     = "json"
	FormatHTML     = "html"
)

// FormatFor picks the output format from a file name's extension: .md for
// Markdown, .json for JSON, .txt for the text table.
func FormatFor(path string) (string, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".md", ".markdown":
		return FormatMarkdown, nil
	case ".json":
		return FormatJSON, nil
	case ".txt":
		return FormatText, nil
	case ".html", ".htm":
		return FormatHTML, nil
	}
	return "", fmt.Errorf("bench: cannot tell the format of %q from its extension (want .md, .json, .txt or .html)", path)
}

// Write renders the report in format.
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case FormatText:
		return r.WriteText(w)
	case FormatMarkdown:
		return r.WriteMarkdown(w)
	case FormatJSON:
		return r.WriteJSON(w)
	case FormatHTML:
		return r.WriteHTML(w)
	}
	return fmt.Errorf("bench: unknown format %q", format)
}

// WriteJSON writes the report as indented JSON; durations are in
// nanoseconds.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the settings line, the aligned table and the notes.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintln(ew, r.settings())
	for _, b := range r.Backends {
		fmt.Fprintf(ew, "  %s: %s\n", b.Backend, b.URL)
	}
	fmt.Fprintln(ew)
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	for _, row := range r.rows() {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(table.String()) {
		fmt.Fprintln(ew, strings.TrimRight(line, " \n"))
	}
	fmt.Fprintln(ew)
	for _, n := range r.notes() {
		fmt.Fprintln(ew, n)
	}
	return ew.err
}

// WriteMarkdown writes the same as WriteText as a Markdown section.
func (r *Report) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "## dlock bench\n\n%s\n\n", r.settings())
	for _, b := range r.Backends {
		fmt.Fprintf(ew, "- %s: `%s`\n", b.Backend, b.URL)
	}
	fmt.Fprintln(ew)
	for i, row := range r.rows() {
		cells := make([]string, len(row))
		for j, c := range row {
			cells[j] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(ew, "| %s |\n", strings.Join(cells, " | "))
		if i == 0 {
			fmt.Fprintf(ew, "|%s\n", strings.Repeat("---|", len(row)))
		}
	}
	fmt.Fprintln(ew)
	for _, n := range r.notes() {
		fmt.Fprintf(ew, "%s\n\n", n)
	}
	return ew.err
}

func (r *Report) settings() string {
	c := r.Config
	return fmt.Sprintf("dlock bench %s: uncontended n=%d, handoff n=%d (settle %v), %d workers for %v per throughput scenario, ttl %v, %d rounds; %s, GOMAXPROCS=%d",
		r.Started.Format(time.RFC3339), c.N, c.HandoffN, c.Settle, c.Workers, c.Duration, c.TTL, c.Rounds, r.GoVersion, r.GOMAXPROCS)
}

func (r *Report) notes() []string {
	notes := []string{
		"unc: one worker, acquire + release. handoff: the holder releases at t0, the waiter blocked in acquire\n" +
			"(given the settle time to reach its wait) returns at t1. cont: all workers on one name, each with its\n" +
			"own client; fairness = min/max of the per-worker counts. indep: one name per worker.\n" +
			"floor: the backend's minimal raw client calls, no library (waiting = spinning attempts), measured in\n" +
			"turns with dlock (rounds). " +
			"×floor: dlock over floor. handoff/unc: the row's handoff p50 over its own unc p50.",
	}
	for _, b := range r.Backends {
		for _, res := range []Result{b.Dlock, b.Floor} {
			for _, e := range res.Errors {
				notes = append(notes, fmt.Sprintf("ERROR %s %s %s", b.Backend, res.Client, e))
			}
		}
	}
	return notes
}

var header = []string{
	"backend", "client",
	"unc p50", "unc p99", "unc ops/s",
	"handoff p50", "handoff p99",
	"cont ops/s", "fairness", "min/max",
	"indep ops/s",
	"unc p50 ×floor", "handoff/unc", "cont ops ×floor",
	"caps",
}

// rows is the table, header first: two rows per backend.
func (r *Report) rows() [][]string {
	rows := [][]string{header}
	for _, b := range r.Backends {
		for _, res := range []Result{b.Dlock, b.Floor} {
			row := []string{b.Backend, res.Client}
			if l := res.Uncontended; l != nil {
				row = append(row, FormatDuration(l.P50), FormatDuration(l.P99), formatOps(l.OpsPerSec))
			} else {
				row = append(row, "ERR", "ERR", "ERR")
			}
			if l := res.Handoff; l != nil {
				row = append(row, FormatDuration(l.P50), FormatDuration(l.P99))
			} else {
				row = append(row, "ERR", "ERR")
			}
			if t := res.Contended; t != nil {
				row = append(row, formatOps(t.OpsPerSec), fmt.Sprintf("%.2f", t.Fairness), fmt.Sprintf("%d/%d", t.Min, t.Max))
			} else {
				row = append(row, "ERR", "ERR", "ERR")
			}
			if t := res.Independent; t != nil {
				row = append(row, formatOps(t.OpsPerSec))
			} else {
				row = append(row, "ERR")
			}
			if res.Client == "dlock" {
				row = append(row, formatRatio(b.Ratios.UncontendedP50), formatRatio(b.Ratios.HandoffDlock),
					formatRatio(b.Ratios.ContendedOps), b.Capabilities.String())
			} else {
				row = append(row, "", formatRatio(b.Ratios.HandoffFloor), "", "")
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// String lists the capabilities the bench reports, as
// "fencing=yes fifo=no notified=yes".
func (c Capabilities) String() string {
	yn := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	return fmt.Sprintf("fencing=%s fifo=%s notified=%s", yn(c.Fencing), yn(c.FIFO), yn(c.NotifiedWait))
}

// FormatDuration renders d with three significant digits: 812ns, 52.3µs,
// 1.21ms, 2.05s.
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		return sig3(float64(d)/1e3) + "µs"
	case d < time.Second:
		return sig3(float64(d)/1e6) + "ms"
	}
	return sig3(d.Seconds()) + "s"
}

// sig3 formats v (≥ 1) with three significant digits.
func sig3(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func formatOps(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func formatRatio(v float64) string {
	if v <= 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "x"
}

// errWriter keeps the first write error so rendering can ignore them.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
