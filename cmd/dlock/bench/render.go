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

// WriteText writes the settings, a table per backend and the notes, in
// at most MaxTextWidth columns.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintln(ew, r.settings())
	fmt.Fprintln(ew, r.machineLoad())
	fmt.Fprintln(ew)
	for _, b := range r.blocks() {
		fmt.Fprintln(ew, b.Title)
		fmt.Fprintln(ew, b.URL)
		if err := writeAligned(ew, b.Rows); err != nil {
			return err
		}
		fmt.Fprintln(ew)
	}
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

// MaxTextWidth is the most columns a line of the text report takes.
const MaxTextWidth = 120

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
	fmt.Fprintf(ew, "## dlock bench\n\n%s\n\n%s\n\n", strings.ReplaceAll(r.settings(), "\n", " "), r.machineLoad())
	for _, b := range r.blocks() {
		fmt.Fprintf(ew, "### %s\n\n`%s`\n\n", b.Title, b.URL)
		writeMarkdownTable(ew, b.Rows)
		fmt.Fprintln(ew)
	}
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

// settings are two lines: the run's sizes, and Go.
func (r *Report) settings() string {
	c := r.Config
	return fmt.Sprintf("dlock bench %s: uncontended n=%d, handoff n=%d (settle %v), %d workers for %v per throughput\n"+
		"scenario, ttl %v, %d rounds; %s, GOMAXPROCS=%d",
		r.Started.Format(time.RFC3339), c.N, c.HandoffN, c.Settle, c.Workers, c.Duration, c.TTL, c.Rounds, r.GoVersion, r.GOMAXPROCS)
}

// machineLoad says the machine's size and load at the start and end of the
// run, and warns when it was busy.
func (r *Report) machineLoad() string {
	load := func(l []float64) string {
		if len(l) < 3 {
			return "unknown"
		}
		return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
	}
	s := fmt.Sprintf("machine: %d CPUs; load average (1, 5, 15 min) %s at start, %s at end", r.NumCPU, load(r.LoadStart), load(r.LoadEnd))
	if r.busy() {
		s += fmt.Sprintf("\nbusy machine: a load average above its %d CPUs makes the figures noisy; compare them only with\n"+
			"the same run's, or rerun on a quiet machine", r.NumCPU)
	}
	return s
}

// busy reports whether the 1-minute load average at the start or end of
// the run was above the number of CPUs.
func (r *Report) busy() bool {
	for _, l := range [][]float64{r.LoadStart, r.LoadEnd} {
		if len(l) > 0 && r.NumCPU > 0 && l[0] > float64(r.NumCPU) {
			return true
		}
	}
	return false
}

// noisyMark follows a figure whose rounds disagree by more than NoisyAbove.
const noisyMark = " !"

func (r *Report) notes() []string {
	notes := []string{
		"unc: one worker, acquire + release. handoff: the holder releases at t0, the waiter blocked in acquire\n" +
			"(given the settle time to reach its wait) returns at t1. cont: all workers on one name, each with its\n" +
			"own client; fairness = min/max of the per-worker counts. indep: one name per worker.\n" +
			"floor: the backend's minimal raw client calls, no library (waiting = spinning attempts), measured in\n" +
			"turns with dlock (rounds). Each figure is followed by its lowest and highest over the rounds (lo–hi).\n" +
			"× floor speed: how many times as fast as the floor dlock is (higher is faster, 1.00× = as fast, 0.50× =\n" +
			"half as fast): the floor's p50 over dlock's for a latency, dlock's ops/s over the floor's for a\n" +
			"throughput; its range is the same ratio round by round.",
	}
	if n := r.noisy(); n > 0 {
		notes = append(notes, fmt.Sprintf("noisy: %d figure(s) marked%s: their rounds disagree by more than %.0f%% (highest − lowest over\n"+
			"the median); rerun on a quiet machine before comparing them (p99s are not marked: tails vary by nature).",
			n, noisyMark, NoisyAbove*100))
	}
	if r.hasPeers() {
		n := "peers: other libraries' locks on the same servers, each worker its own client, measured in turns\n" +
			"with dlock and the floor, waiting (handoff, cont) with the library's own wait. × best peer speed: how\n" +
			"many times as fast as the fastest peer (the lowest p50, the highest ops/s, named) dlock is; higher is\n" +
			"faster."
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

// noisy counts the figures marked noisy in the report.
func (r *Report) noisy() int {
	n := 0
	for _, b := range r.Backends {
		for _, res := range b.results() {
			for _, v := range [][]float64{
				roundP50s(res.Uncontended), roundLatOps(res.Uncontended), roundP50s(res.Handoff),
				roundThr(res.Contended), roundThr(res.Independent),
			} {
				if Noise(v) > NoisyAbove {
					n++
				}
			}
		}
	}
	return n
}

func roundP50s(l *Latency) []float64 {
	if l == nil {
		return nil
	}
	out := make([]float64, len(l.Rounds))
	for i, r := range l.Rounds {
		out[i] = float64(r.P50)
	}
	return out
}

func roundP99s(l *Latency) []float64 {
	if l == nil {
		return nil
	}
	out := make([]float64, len(l.Rounds))
	for i, r := range l.Rounds {
		out[i] = float64(r.P99)
	}
	return out
}

func roundLatOps(l *Latency) []float64 {
	if l == nil {
		return nil
	}
	var out []float64
	for _, r := range l.Rounds {
		if r.OpsPerSec > 0 {
			out = append(out, r.OpsPerSec)
		}
	}
	return out
}

func roundThr(t *Throughput) []float64 {
	if t == nil {
		return nil
	}
	return t.RoundOpsPerSec
}

func (r *Report) hasPeers() bool {
	for _, b := range r.Backends {
		if len(b.Peers) > 0 {
			return true
		}
	}
	return false
}

// figure formats a value with the range of its rounds, "455µs (380µs–573µs)",
// marked noisy when flag is set and the rounds disagree too much; "ERR"
// when the scenario failed (nil rounds and ok false).
func figure(ok bool, v float64, rounds []float64, format func(float64) string, flag bool) string {
	if !ok {
		return "ERR"
	}
	s := format(v)
	if len(rounds) > 1 {
		lo, hi := span(rounds)
		s += " (" + format(lo) + "–" + format(hi) + ")"
	}
	if flag && Noise(rounds) > NoisyAbove {
		s += noisyMark
	}
	return s
}

func durF(v float64) string { return FormatDuration(time.Duration(v)) }

// latCell is a latency's p50 (or p99) with its range over the rounds.
func latCell(l *Latency, p99 bool) string {
	if l == nil {
		return figure(false, 0, nil, durF, false)
	}
	if p99 {
		return figure(true, float64(l.P99), roundP99s(l), durF, false)
	}
	return figure(true, float64(l.P50), roundP50s(l), durF, true)
}

// latOpsCell is a latency scenario's ops/s with its range over the rounds.
func latOpsCell(l *Latency) string {
	if l == nil {
		return "ERR"
	}
	return figure(true, l.OpsPerSec, roundLatOps(l), FormatOps, true)
}

// thrCell is a throughput's ops/s with its range over the rounds.
func thrCell(t *Throughput) string {
	if t == nil {
		return "ERR"
	}
	return figure(true, t.OpsPerSec, t.RoundOpsPerSec, FormatOps, true)
}

func fairCell(t *Throughput) string {
	if t == nil {
		return "ERR"
	}
	return fmt.Sprintf("%.2f (%d/%d)", t.Fairness, t.Min, t.Max)
}

// speedCell is a Speed with its range over the rounds: "0.66× (0.60–0.72)";
// "-" when there is none.
func speedCell(s *Speed) string {
	if s == nil || s.X <= 0 {
		return "-"
	}
	out := formatSpeed(s.X)
	if s.Max > 0 {
		out += " (" + strconv.FormatFloat(s.Min, 'f', 2, 64) + "–" + strconv.FormatFloat(s.Max, 'f', 2, 64) + ")"
	}
	return out
}

func formatSpeed(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) + "×" }

// floorHeader and peerHeader head the ratio columns: both read "higher is
// faster".
const (
	floorHeader = "dlock × floor speed (higher=faster)"
	peerHeader  = "dlock × best peer speed (higher=faster)"
)

// block is one backend's table, header first: a row per figure, a column
// per client (dlock, the floor), and dlock's speed against the floor.
type block struct {
	Backend string
	Title   string // the backend and its capabilities
	URL     string // on a line of its own: a redlock URL names five servers
	Rows    [][]string
}

// blocks are the backends' tables.
func (r *Report) blocks() []block {
	var out []block
	for _, b := range r.Backends {
		d, f := b.Dlock, b.Floor
		rows := [][]string{{b.Backend, "dlock", "floor", floorHeader}}
		add := func(name string, cell func(Result) string, s *Speed) {
			rows = append(rows, []string{name, cell(d), cell(f), speedCell(s)})
		}
		unc := func(r Result) *Latency { return r.Uncontended }
		hand := func(r Result) *Latency { return r.Handoff }
		add("unc p50", func(r Result) string { return latCell(unc(r), false) }, b.VsFloor.Uncontended)
		add("unc p99", func(r Result) string { return latCell(unc(r), true) }, nil)
		add("unc ops/s", func(r Result) string { return latOpsCell(unc(r)) }, nil)
		add("handoff p50", func(r Result) string { return latCell(hand(r), false) }, b.VsFloor.Handoff)
		add("handoff p99", func(r Result) string { return latCell(hand(r), true) }, nil)
		add("cont ops/s", func(r Result) string { return thrCell(r.Contended) }, b.VsFloor.Contended)
		add("cont fairness", func(r Result) string { return fairCell(r.Contended) }, nil)
		add("indep ops/s", func(r Result) string { return thrCell(r.Independent) }, b.VsFloor.Independent)
		title := b.Backend
		if b.Capabilities != (Capabilities{}) || d.Uncontended != nil {
			title += "  (" + b.Capabilities.String() + ")"
		}
		out = append(out, block{Backend: b.Backend, Title: title, URL: b.URL, Rows: rows})
	}
	return out
}

// peersTitle heads the side-by-side tables.
const peersTitle = "dlock beside other libraries"

// peerTable is one backend's side-by-side table, header first: a row per
// figure, a column per client, and dlock's speed against the best peer.
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
		res := append([]Result{b.Dlock}, b.Peers...)
		head := []string{b.Backend}
		for _, c := range res {
			head = append(head, c.Client)
		}
		rows := [][]string{append(head, peerHeader)}
		vs := b.VsPeers
		if vs == nil {
			vs = &PeerRatios{}
		}
		add := func(figure string, cell func(Result) string, best *PeerRatio) {
			row := []string{figure}
			for _, c := range res {
				row = append(row, cell(c))
			}
			vs := ""
			if best != nil {
				vs = speedCell(best.Speed) + " " + best.Peer
			}
			rows = append(rows, append(row, vs))
		}
		add("unc p50", func(r Result) string { return latCell(r.Uncontended, false) }, vs.Uncontended)
		add("unc p99", func(r Result) string { return latCell(r.Uncontended, true) }, nil)
		add("handoff p50", func(r Result) string { return latCell(r.Handoff, false) }, vs.Handoff)
		add("handoff p99", func(r Result) string { return latCell(r.Handoff, true) }, nil)
		add("cont ops/s", func(r Result) string { return thrCell(r.Contended) }, vs.Contended)
		add("cont fairness", func(r Result) string { return fairCell(r.Contended) }, nil)
		add("indep ops/s", func(r Result) string { return thrCell(r.Independent) }, vs.Independent)
		tables = append(tables, peerTable{Backend: b.Backend, Rows: rows})
	}
	return tables
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

// FormatOps renders a rate with three significant digits: 39.4, 812,
// 1.18k, 287k, 1.02M.
func FormatOps(v float64) string {
	switch {
	case v < 0:
		return "-" + FormatOps(-v)
	case v < 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 999.5:
		return sig3(v)
	case v < 999.5e3:
		return sig3(v/1e3) + "k"
	}
	return sig3(v/1e6) + "M"
}

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
