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
	if tables := r.peerTables(); len(tables) > 0 {
		fmt.Fprintln(ew, peersTitle)
		fmt.Fprintln(ew)
		for _, t := range tables {
			if err := writeAligned(ew, t.Rows); err != nil {
				return err
			}
			fmt.Fprintln(ew)
		}
	}
	for _, n := range r.notes() {
		fmt.Fprintln(ew, n)
	}
	return ew.err
}

// writeAligned writes rows as a table aligned in columns, trailing spaces
// trimmed.
func writeAligned(w io.Writer, rows [][]string) error {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(table.String()) {
		if _, err := fmt.Fprintln(w, strings.TrimRight(line, " \n")); err != nil {
			return err
		}
	}
	return nil
}

// WriteMarkdown writes the same as WriteText as a Markdown section.
func (r *Report) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "## dlock bench\n\n%s\n\n", r.settings())
	for _, b := range r.Backends {
		fmt.Fprintf(ew, "- %s: `%s`\n", b.Backend, b.URL)
	}
	fmt.Fprintln(ew)
	writeMarkdownTable(ew, r.rows())
	fmt.Fprintln(ew)
	if tables := r.peerTables(); len(tables) > 0 {
		fmt.Fprintf(ew, "### %s\n\n", peersTitle)
		for _, t := range tables {
			fmt.Fprintf(ew, "#### %s\n\n", t.Backend)
			writeMarkdownTable(ew, t.Rows)
			fmt.Fprintln(ew)
		}
	}
	for _, n := range r.notes() {
		fmt.Fprintf(ew, "%s\n\n", n)
	}
	return ew.err
}

// writeMarkdownTable writes rows, header first, as a Markdown table.
func writeMarkdownTable(w io.Writer, rows [][]string) {
	for i, row := range rows {
		cells := make([]string, len(row))
		for j, c := range row {
			cells[j] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(row)))
		}
	}
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
	if r.hasPeers() {
		n := "peers: other libraries' locks on the same servers, each worker its own client, measured in turns\n" +
			"with dlock and the floor, waiting (handoff, cont) with the library's own wait. dlock/best peer: dlock's\n" +
			"figure over the best peer's (the lowest p50, the highest ops/s), that peer named: below 1 dlock is\n" +
			"faster for a p50, above 1 for ops/s."
		for _, b := range r.Backends {
			for _, p := range b.Peers {
				n += fmt.Sprintf("\n%s %s", b.Backend, p.Client)
				if p.Module != "" {
					n += " (" + strings.TrimSpace(p.Module+" "+p.Version) + ")"
				}
				if p.About != "" {
					n += ": " + p.About
				}
			}
		}
		notes = append(notes, n)
	}
	for _, b := range r.Backends {
		for _, res := range b.results() {
			for _, e := range res.Errors {
				notes = append(notes, fmt.Sprintf("ERROR %s %s %s", b.Backend, res.Client, e))
			}
		}
	}
	return notes
}

func (r *Report) hasPeers() bool {
	for _, b := range r.Backends {
		if len(b.Peers) > 0 {
			return true
		}
	}
	return false
}

// peersTitle heads the side-by-side tables.
const peersTitle = "dlock beside other libraries"

// peerTable is one backend's side-by-side table, header first: a row per
// figure, a column per client, and dlock over the best peer.
type peerTable struct {
	Backend string
	Rows    [][]string
}

// peerTables are the side-by-side tables of the backends with peers.
func (r *Report) peerTables() []peerTable {
	var tables []peerTable
	for _, b := range r.Backends {
		if len(b.Peers) == 0 {
			continue
		}
		res := b.results()
		head := []string{b.Backend}
		for _, c := range res {
			head = append(head, c.Client)
		}
		head = append(head, "dlock/best peer")
		rows := [][]string{head}
		vs := b.VsPeers
		if vs == nil {
			vs = &PeerRatios{}
		}
		add := func(figure string, cell func(Result) string, best *PeerRatio) {
			row := []string{figure}
			for _, c := range res {
				row = append(row, cell(c))
			}
			ratio := ""
			if best != nil {
				ratio = formatRatio(best.Ratio) + " (" + best.Peer + ")"
			}
			rows = append(rows, append(row, ratio))
		}
		lat := func(l func(Result) *Latency, p float64) func(Result) string {
			return func(r Result) string {
				v := l(r)
				switch {
				case v == nil:
					return "ERR"
				case p == 50:
					return FormatDuration(v.P50)
				}
				return FormatDuration(v.P99)
			}
		}
		unc := func(r Result) *Latency { return r.Uncontended }
		hand := func(r Result) *Latency { return r.Handoff }
		thr := func(t func(Result) *Throughput, fairness bool) func(Result) string {
			return func(r Result) string {
				v := t(r)
				switch {
				case v == nil:
					return "ERR"
				case fairness:
					return fmt.Sprintf("%.2f", v.Fairness)
				}
				return formatOps(v.OpsPerSec)
			}
		}
		cont := func(r Result) *Throughput { return r.Contended }
		indep := func(r Result) *Throughput { return r.Independent }
		add("unc p50", lat(unc, 50), vs.Uncontended)
		add("unc p99", lat(unc, 99), nil)
		add("handoff p50", lat(hand, 50), vs.Handoff)
		add("handoff p99", lat(hand, 99), nil)
		add("cont ops/s", thr(cont, false), vs.Contended)
		add("cont fairness", thr(cont, true), nil)
		add("indep ops/s", thr(indep, false), vs.Independent)
		tables = append(tables, peerTable{Backend: b.Backend, Rows: rows})
	}
	return tables
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

// rows is the table, header first: two rows per backend (dlock and the
// floor), and one per peer.
func (r *Report) rows() [][]string {
	rows := [][]string{header}
	for _, b := range r.Backends {
		for _, res := range b.results() {
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
			switch res.Client {
			case "dlock":
				row = append(row, formatRatio(b.Ratios.UncontendedP50), formatRatio(b.Ratios.HandoffDlock),
					formatRatio(b.Ratios.ContendedOps), b.Capabilities.String())
			case "floor":
				row = append(row, "", formatRatio(b.Ratios.HandoffFloor), "", "")
			default: // a peer
				var own float64
				if res.Handoff != nil && res.Uncontended != nil {
					own = ratio(float64(res.Handoff.P50), float64(res.Uncontended.P50))
				}
				row = append(row, "", formatRatio(own), "", "")
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
