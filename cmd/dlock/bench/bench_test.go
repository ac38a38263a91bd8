package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercentile(t *testing.T) {
	seq := func(n int) []time.Duration {
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i + 1)
		}
		return s
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", []time.Duration{7}, 50, 7},
		{"one p99", []time.Duration{7}, 99, 7},
		{"two p50", []time.Duration{1, 2}, 50, 1},
		{"two p51", []time.Duration{1, 2}, 51, 2},
		{"hundred p50", seq(100), 50, 50},
		{"hundred p99", seq(100), 99, 99},
		{"hundred p100", seq(100), 100, 100},
		{"hundred p0", seq(100), 0, 1},
		{"ten p99", seq(10), 99, 10},
		{"ten p90", seq(10), 90, 9},
		{"thousand p99.9", seq(1000), 99.9, 999},
		{"above 100", seq(3), 150, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%d samples, %v) = %v, want %v", len(tt.sorted), tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	samples := []time.Duration{5, 1, 4, 2, 3}
	l := Summarize(samples, 10*time.Second)
	want := Latency{N: 5, P50: 3, P99: 5, Mean: 3, Max: 5, OpsPerSec: 0.5}
	q := l.Quantiles
	l.Quantiles = nil
	if !reflect.DeepEqual(l, want) {
		t.Errorf("Summarize = %+v, want %+v", l, want)
	}
	// The 0th..100th percentiles, nearest rank: 1 up to 20%, 2 up to 40%…
	if len(q) != 101 || q[0] != 1 || q[20] != 1 || q[21] != 2 || q[50] != 3 || q[100] != 5 {
		t.Errorf("Quantiles = %v, want 101 nearest-rank percentiles of 1..5", q)
	}
	if samples[0] != 5 {
		t.Errorf("Summarize sorted its input: %v", samples)
	}
	if z := Summarize(nil, 0); z.Quantiles != nil || z.N != 0 || z.P50 != 0 {
		t.Errorf("Summarize(nil) = %+v, want zero", z)
	}
}

func TestSpread(t *testing.T) {
	tests := []struct {
		counts              []int64
		ops, lo, hi         int64
		fairness, opsPerSec float64
	}{
		{[]int64{10, 5, 8}, 23, 5, 10, 0.5, 11.5},
		{[]int64{4, 4}, 8, 4, 4, 1, 4},
		{[]int64{0, 9}, 9, 0, 9, 0, 4.5},
		{[]int64{0, 0}, 0, 0, 0, 0, 0},
		{nil, 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		th := Throughput{Elapsed: 2 * time.Second}
		Spread(&th, tt.counts)
		if th.Ops != tt.ops || th.Min != tt.lo || th.Max != tt.hi || th.Fairness != tt.fairness ||
			th.OpsPerSec != tt.opsPerSec || th.Workers != len(tt.counts) {
			t.Errorf("Spread(%v) = %+v, want ops=%d min=%d max=%d fairness=%v ops/s=%v",
				tt.counts, th, tt.ops, tt.lo, tt.hi, tt.fairness, tt.opsPerSec)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0ns"},
		{812, "812ns"},
		{1234, "1.23µs"},
		{52_345, "52.3µs"},
		{523_456, "523µs"},
		{1_214_000, "1.21ms"},
		{20_500_000, "20.5ms"},
		{2_050_000_000, "2.05s"},
	}
	for _, tt := range tests {
		if got := FormatDuration(tt.d); got != tt.want {
			t.Errorf("FormatDuration(%d) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestFormatFor(t *testing.T) {
	tests := []struct{ path, want string }{
		{"out.md", FormatMarkdown},
		{"dir/OUT.MD", FormatMarkdown},
		{"r.json", FormatJSON},
		{"r.txt", FormatText},
		{"r.csv", ""},
		{"noext", ""},
	}
	for _, tt := range tests {
		got, err := FormatFor(tt.path)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("FormatFor(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
}

// sampleReport is a fixed report for the rendering tests: redis measured
// in two rounds (dlock's contended rounds disagree: noisy), memory failed.
func sampleReport() *Report {
	lat := func(p50, p99 time.Duration, ops float64) *Latency {
		return &Latency{N: 100, P50: p50, P99: p99, Mean: p50, Max: p99, OpsPerSec: ops, Rounds: []RoundLatency{
			{N: 50, P50: p50 * 95 / 100, P99: p99 * 9 / 10, OpsPerSec: ops * 1.05},
			{N: 50, P50: p50 * 110 / 100, P99: p99, OpsPerSec: ops * 0.9},
		}}
	}
	thr := func(ops float64, lo, hi int64, rounds ...float64) *Throughput {
		t := &Throughput{Elapsed: time.Second, RoundOpsPerSec: rounds}
		Spread(t, []int64{lo, hi})
		t.OpsPerSec = ops
		return t
	}
	b := BackendResult{
		Backend: "redis", URL: "redis://u:xxxxx@127.0.0.1:6379/0",
		Capabilities: Capabilities{Fencing: false, NotifiedWait: true},
		Dlock: Result{Client: "dlock", Uncontended: lat(105*time.Microsecond, 300*time.Microsecond, 9000),
			Handoff: lat(210*time.Microsecond, 1*time.Millisecond, 0), Contended: thr(5000, 80, 100, 4000, 6000),
			Independent: thr(20000, 100, 100, 19000, 21000)},
		Floor: Result{Client: "floor", Uncontended: lat(100*time.Microsecond, 200*time.Microsecond, 10000),
			Handoff: lat(150*time.Microsecond, 400*time.Microsecond, 0), Contended: thr(5500, 90, 100, 5400, 5600),
			Independent: thr(25000, 100, 100, 24000, 26000)},
	}
	b.computeRatios()
	mem := BackendResult{Backend: "memory", URL: "mem://x", Dlock: Result{Client: "dlock", Errors: []string{"handoff: boom"}},
		Floor: Result{Client: "floor"}}
	mem.computeRatios()
	return &Report{
		Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), GoVersion: "go1.26", GOMAXPROCS: 2, NumCPU: 2,
		Config:    Config{Duration: time.Second, N: 100, HandoffN: 100, Workers: 2, TTL: 10 * time.Second, Settle: 20 * time.Millisecond, Rounds: 2},
		LoadStart: []float64{4.51, 3.93, 5.8}, LoadEnd: []float64{1.5, 2, 3},
		Backends: []BackendResult{b, mem},
	}
}

func TestRatios(t *testing.T) {
	b := sampleReport().Backends[0]
	r := b.Ratios
	want := Ratios{UncontendedP50: 1.05, HandoffDlock: 2, HandoffFloor: 1.5, ContendedOps: 5000.0 / 5500}
	const eps = 1e-9
	near := func(a, b float64) bool { return a > b-eps && a < b+eps }
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"uncontended", r.UncontendedP50, want.UncontendedP50},
		{"handoff dlock", r.HandoffDlock, want.HandoffDlock},
		{"handoff floor", r.HandoffFloor, want.HandoffFloor},
		{"contended", r.ContendedOps, want.ContendedOps},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s ratio = %v, want %v", c.name, c.got, c.want)
		}
	}
	// Speeds read "higher is faster" for latencies and throughputs alike,
	// with the ratio of each round.
	for _, c := range []struct {
		name      string
		got       *Speed
		x, lo, hi float64
	}{
		{"uncontended: floor p50 over dlock's", b.VsFloor.Uncontended, 100.0 / 105, 100.0 / 105, 100.0 / 105},
		{"handoff", b.VsFloor.Handoff, 150.0 / 210, 150.0 / 210, 150.0 / 210},
		{"contended: dlock ops over the floor's", b.VsFloor.Contended, 5000.0 / 5500, 4000.0 / 5400, 6000.0 / 5600},
		{"independent", b.VsFloor.Independent, 0.8, 19000.0 / 24000, 21000.0 / 26000},
	} {
		if c.got == nil || !near(c.got.X, c.x) || !near(c.got.Min, c.lo) || !near(c.got.Max, c.hi) {
			t.Errorf("%s: speed %+v, want %v (%v–%v)", c.name, c.got, c.x, c.lo, c.hi)
		}
	}
	// A round in which dlock did nothing is a ratio of 0, not a gap; a
	// round the other did nothing in leaves no range.
	a := &Throughput{OpsPerSec: 50, RoundOpsPerSec: []float64{0, 100}}
	if got := throughputSpeed(a, &Throughput{OpsPerSec: 75, RoundOpsPerSec: []float64{50, 100}}); got == nil || got.Min != 0 || got.Max != 1 {
		t.Errorf("speed with an idle dlock round = %+v, want 0–1", got)
	}
	if got := throughputSpeed(a, &Throughput{OpsPerSec: 75, RoundOpsPerSec: []float64{0, 100}}); got == nil || got.Max != 0 {
		t.Errorf("speed with an idle floor round = %+v, want no range", got)
	}
	if got := speedCell(&Speed{X: 0.5, Min: 0, Max: 1}); got != "0.50× (0.00–1.00)" {
		t.Errorf("speedCell = %q", got)
	}
	if m := sampleReport().Backends[1]; m.Ratios != (Ratios{}) || m.VsFloor != (Speeds{}) {
		t.Errorf("ratios without measurements = %+v %+v, want zero", m.Ratios, m.VsFloor)
	}
}

// textLines checks that no line of out is wider than MaxTextWidth.
func textLines(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > MaxTextWidth {
			t.Errorf("line of %d columns, want at most %d:\n%s", n, MaxTextWidth, l)
		}
	}
	return lines
}

func TestWriteText(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"redis  (fencing=no fifo=no notified=yes)\nredis://u:xxxxx@127.0.0.1:6379/0\n",
		"load average (1, 5, 15 min) 4.51 3.93 5.80 at start, 1.50 2.00 3.00 at end",
		"busy machine",
		"dlock × floor speed (higher=faster)",
		"105µs (99.8µs–116µs)", "9.00k (8.10k–9.45k)",
		"0.95× (0.95–0.95)", "0.91× (0.74–1.07)", "0.80× (0.79–0.81)",
		"0.80 (80/100)",
		"5.00k (4.00k–6.00k) !",
		"noisy: 1 figure(s) marked !",
		"ERROR memory dlock handoff: boom",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "5.50k (5.40k–5.60k) !") {
		t.Errorf("a steady figure is marked noisy:\n%s", out)
	}
	// Each backend's table is aligned: every column starts at the same
	// offset on every row.
	lines := textLines(t, out)
	var table []string
	for i, l := range lines {
		if strings.HasPrefix(l, "redis ") && strings.Contains(l, "floor speed") {
			table = lines[i : i+9]
		}
	}
	if table == nil {
		t.Fatalf("no redis table:\n%s", out)
	}
	for _, head := range []string{"dlock", "floor", "dlock × floor"} {
		col := utf8.RuneCountInString(table[0][:strings.Index(table[0], head)])
		for _, l := range table[1:] {
			if r := []rune(l); len(r) > col && (r[col-1] != ' ' || r[col] == ' ') {
				t.Errorf("row not aligned with %q at rune %d:\n%s\n%s", head, col, table[0], l)
			}
		}
	}
	if f := strings.Fields(table[8]); f[0] != "indep" {
		t.Errorf("the table's last row is %q, want indep ops/s", table[8])
	}
}

// A quiet machine, and steady rounds, get no warning.
func TestWriteTextQuiet(t *testing.T) {
	r := sampleReport()
	r.LoadStart, r.LoadEnd = []float64{0.5, 0.5, 0.5}, nil
	r.Backends[0].Dlock.Contended.RoundOpsPerSec = []float64{4900, 5100}
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, no := range []string{"busy machine", "noisy", " !"} {
		if strings.Contains(buf.String(), no) {
			t.Errorf("text output contains %q:\n%s", no, buf.String())
		}
	}
	if !strings.Contains(buf.String(), "0.50 0.50 0.50 at start, unknown at end") {
		t.Errorf("text output lacks the load:\n%s", buf.String())
	}
}

func TestNoise(t *testing.T) {
	for _, c := range []struct {
		vs   []float64
		want float64
	}{
		{nil, 0}, {[]float64{5}, 0}, {[]float64{380, 573, 455}, (573.0 - 380) / 455},
		{[]float64{4, 6}, 0.4}, {[]float64{0, 0}, 0}, {[]float64{91e3, 44e3, 157e3}, 113.0 / 91},
	} {
		if got := Noise(c.vs); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("Noise(%v) = %v, want %v", c.vs, got, c.want)
		}
	}
	// The figures: both flagged.
	if Noise([]float64{380, 573, 455}) <= NoisyAbove || Noise([]float64{91e3, 44e3, 157e3}) <= NoisyAbove {
		t.Error("three rounds at 380/573/455µs, or 91k/44k/157k ops/s, are not noisy")
	}
}

func TestSplitRounds(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	// Six turns of two samples in three rounds of two turns each.
	samples := ms(1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6)
	marks := []int{2, 4, 6, 8, 10, 12}
	elapsed := ms(2, 4, 6, 8, 10, 12)
	got := SplitRounds(samples, marks, elapsed, 3)
	want := []RoundLatency{
		{N: 4, P50: ms(1)[0], P99: ms(2)[0], OpsPerSec: 4 / 0.006},
		{N: 4, P50: ms(3)[0], P99: ms(4)[0], OpsPerSec: 4 / 0.014},
		{N: 4, P50: ms(5)[0], P99: ms(6)[0], OpsPerSec: 4 / 0.022},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d rounds, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.N != w.N || g.P50 != w.P50 || g.P99 != w.P99 || g.OpsPerSec < w.OpsPerSec-1e-6 || g.OpsPerSec > w.OpsPerSec+1e-6 {
			t.Errorf("round %d = %+v, want %+v", i, g, w)
		}
	}
	// Fewer turns than rounds: a round per turn; no elapsed: no ops/s.
	if got := SplitRounds(samples, []int{5, 12}, nil, 4); len(got) != 2 || got[0].N != 5 || got[1].N != 7 || got[0].OpsPerSec != 0 {
		t.Errorf("two turns in four rounds = %+v, want two rounds of 5 and 7", got)
	}
	if got := SplitRounds(nil, nil, nil, 4); got != nil {
		t.Errorf("no turns = %+v, want nil", got)
	}
}

func TestFormatOps(t *testing.T) {
	for v, want := range map[float64]string{
		0.5: "0.50", 39.4: "39.4", 812: "812", 999.4: "999", 999.6: "1.00k", 1176: "1.18k", 286537: "287k", 1.02e6: "1.02M",
	} {
		if got := FormatOps(v); got != want {
			t.Errorf("FormatOps(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestParseLoadAverage(t *testing.T) {
	if got := parseLoadAverage("4.51 3.93 5.80 3/1234 5678\n"); len(got) != 3 || got[0] != 4.51 || got[2] != 5.8 {
		t.Errorf("parseLoadAverage = %v", got)
	}
	if got := parseLoadAverage("x y"); got != nil {
		t.Errorf("parseLoadAverage(junk) = %v, want nil", got)
	}
}

func TestWriteMarkdown(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "|") {
			rows = append(rows, l)
		}
	}
	if len(rows) != 20 {
		t.Fatalf("got %d table rows, want 20 (2 backends × header, separator, 8 figures):\n%s", len(rows), out)
	}
	want := strings.Count(rows[0], "|")
	for _, r := range rows {
		if got := strings.Count(r, "|"); got != want {
			t.Errorf("row has %d pipes, want %d: %s", got, want, r)
		}
	}
	if rows[0] != "| redis | dlock | floor | dlock × floor speed (higher=faster) |" || !strings.HasPrefix(rows[1], "|---|") {
		t.Errorf("header = %s\n%s", rows[0], rows[1])
	}
	if rows[2] != "| unc p50 | 105µs (99.8µs–116µs) | 100µs (95.0µs–110µs) | 0.95× (0.95–0.95) |" {
		t.Errorf("unc p50 row = %s", rows[2])
	}
	if !strings.Contains(out, "### redis  (fencing=no fifo=no notified=yes)\n\n`redis://u:xxxxx@127.0.0.1:6379/0`") {
		t.Errorf("markdown lacks the redacted URL:\n%s", out)
	}
}

func TestWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, buf.String())
	}
	b := raw["backends"].([]any)[0].(map[string]any)
	unc := b["dlock"].(map[string]any)["uncontended"].(map[string]any)
	if got := unc["p50_ns"]; got != float64(105_000) {
		t.Errorf("dlock uncontended p50_ns = %v, want 105000", got)
	}
	cont := b["floor"].(map[string]any)["contended"].(map[string]any)
	if got := cont["per_worker"].([]any); len(got) != 2 {
		t.Errorf("per_worker = %v, want 2 counts", got)
	}
	if got := raw["config"].(map[string]any)["duration_ns"]; got != float64(time.Second) {
		t.Errorf("config duration_ns = %v, want %d", got, time.Second)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Backends[0].Ratios != sampleReport().Backends[0].Ratios {
		t.Errorf("ratios did not round-trip: %+v", back.Backends[0].Ratios)
	}
	if got, want := back.Backends[0].VsFloor, sampleReport().Backends[0].VsFloor; !reflect.DeepEqual(got, want) {
		t.Errorf("vs_floor did not round-trip: %+v, want %+v", got, want)
	}
	if got, want := back.Backends[0].Dlock.Uncontended.Rounds, sampleReport().Backends[0].Dlock.Uncontended.Rounds; !reflect.DeepEqual(got, want) {
		t.Errorf("rounds did not round-trip: %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(back.LoadStart, []float64{4.51, 3.93, 5.8}) {
		t.Errorf("load_start did not round-trip: %v", back.LoadStart)
	}
}

// memoryTarget is the memory driver on a store of the test's own.
func memoryTarget() Target {
	store := memory.NewStore()
	return Target{
		Backend: "memory", URL: "mem://test",
		Open:  func(context.Context) (*dlock.Locker, error) { return memory.New(store, nil) },
		Floor: MemoryFloors(),
	}
}

func smallConfig() Config {
	return Config{Duration: 150 * time.Millisecond, N: 200, HandoffN: 10, Workers: 4, Settle: 2 * time.Millisecond}
}

func TestRunMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var progress bytes.Buffer
	cfg := smallConfig()
	cfg.Progress = &progress
	rep, err := Run(ctx, cfg, []Target{memoryTarget()})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rep.Backends) != 1 {
		t.Fatalf("got %d backends, want 1", len(rep.Backends))
	}
	b := rep.Backends[0]
	if !b.Capabilities.Fencing || !b.Capabilities.NotifiedWait {
		t.Errorf("capabilities = %+v, want the memory driver's fencing and notified wait", b.Capabilities)
	}
	for _, res := range []Result{b.Dlock, b.Floor} {
		t.Run(res.Client, func(t *testing.T) {
			if u := res.Uncontended; u == nil || u.N != cfg.N || u.P50 <= 0 || u.P50 > u.P99 || u.OpsPerSec <= 0 {
				t.Errorf("uncontended = %+v, want n=%d and 0 < p50 ≤ p99, ops > 0", u, cfg.N)
			}
			if h := res.Handoff; h == nil || h.N != cfg.HandoffN || h.P50 <= 0 || h.P50 > h.P99 {
				t.Errorf("handoff = %+v, want n=%d and 0 < p50 ≤ p99", h, cfg.HandoffN)
			}
			for name, th := range map[string]*Throughput{"contended": res.Contended, "independent": res.Independent} {
				if th == nil {
					t.Errorf("%s missing", name)
					continue
				}
				if th.Workers != cfg.Workers || len(th.PerWorker) != cfg.Workers || th.Ops <= 0 || th.OpsPerSec <= 0 {
					t.Errorf("%s = %+v, want %d workers and ops > 0", name, th, cfg.Workers)
				}
				if th.Fairness < 0 || th.Fairness > 1 || th.Min > th.Max {
					t.Errorf("%s fairness = %v (min %d, max %d), want in [0,1]", name, th.Fairness, th.Min, th.Max)
				}
				if len(th.RoundOpsPerSec) != DefaultRounds {
					t.Errorf("%s has %d rounds, want %d", name, len(th.RoundOpsPerSec), DefaultRounds)
				}
				for i, ops := range th.RoundOpsPerSec {
					if ops <= 0 {
						t.Errorf("%s round %d: %v ops/s, want > 0 (a lock left over from the round before?)", name, i, ops)
					}
				}
				if th.Overlaps != 0 {
					t.Errorf("%s overlaps = %d, want 0", name, th.Overlaps)
				}
				if th.Elapsed < cfg.Duration {
					t.Errorf("%s elapsed = %v, want ≥ %v", name, th.Elapsed, cfg.Duration)
				}
			}
		})
	}
	if b.Ratios.UncontendedP50 <= 0 || b.Ratios.ContendedOps <= 0 || b.Ratios.HandoffDlock <= 0 {
		t.Errorf("ratios = %+v, want all positive", b.Ratios)
	}
	if got := strings.Count(progress.String(), "\n"); got != 8 {
		t.Errorf("got %d progress lines, want 8 (4 scenarios × 2 clients):\n%s", got, progress.String())
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := smallConfig()
	cfg.Duration = time.Minute
	var rep *Report
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, err = Run(ctx, cfg, []Target{memoryTarget()})
	}()
	time.Sleep(300 * time.Millisecond) // into the first throughput scenario
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run error = %v, want context.Canceled", err)
	}
	if rep == nil || len(rep.Backends) != 1 || rep.Backends[0].Dlock.Uncontended == nil {
		t.Errorf("report = %+v, want the measurements made before the cancellation", rep)
	}
}

// lyingFloor grants every attempt: the bench must notice.
type lyingFloor struct{}

func (lyingFloor) TryLock(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}
func (lyingFloor) Unlock(context.Context, string, string) error { return nil }
func (lyingFloor) Close() error                                 { return nil }

func TestRunReportsFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := smallConfig()
	cfg.Duration = 50 * time.Millisecond
	broken := errors.New("no server")
	targets := []Target{{
		Backend: "broken", URL: "x://",
		Open:  func(context.Context) (*dlock.Locker, error) { return nil, broken },
		Floor: func(context.Context) (Floor, error) { return lyingFloor{}, nil },
	}}
	rep, err := Run(ctx, cfg, targets)
	if err != nil {
		t.Fatal(err)
	}
	b := rep.Backends[0]
	if len(b.Dlock.Errors) != 1 || !strings.HasPrefix(b.Dlock.Errors[0], "connect: ") || b.Dlock.Uncontended != nil {
		t.Errorf("dlock errors = %q, want one connect error", b.Dlock.Errors)
	}
	if rep.Err() == nil || !strings.Contains(rep.Err().Error(), "no server") {
		t.Errorf("report error = %v, want the open failure", rep.Err())
	}
	if b.Floor.Handoff != nil || len(b.Floor.Errors) == 0 || !strings.Contains(strings.Join(b.Floor.Errors, "\n"), "granted a lock that was held") {
		t.Errorf("floor errors = %q, want the handoff to catch the lying floor", b.Floor.Errors)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "ERR") {
		t.Errorf("text output does not show the failures:\n%s", buf.String())
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Duration: DefaultDuration, N: DefaultN, HandoffN: DefaultHandoffN, Workers: DefaultWorkers, TTL: DefaultTTL, Settle: DefaultSettle, Rounds: DefaultRounds}
	if c != want {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
	if _, err := (Config{Workers: -1}).withDefaults(); err == nil {
		t.Error("negative workers accepted")
	}
}
