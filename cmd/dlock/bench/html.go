package bench

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"io"
	"strings"
	"time"
)

// The charts are drawn by Chart.js (MIT, assets/chart.js-LICENSE.md), a
// maintained charting library, inlined so that the page needs no network
// when it is viewed.
var (
	//go:embed assets/chart.umd.min.js
	chartJS string
	//go:embed report.html.tmpl
	reportTmpl string

	htmlTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
		"dur":   FormatDuration,
		"ratio": formatRatio,
		"ops":   formatOps,
		"pct":   func(f float64) string { return sig3(f*100) + "%" },
		"noisy": func(cell string) bool { return strings.HasSuffix(cell, noisyMark) },
		"cell":  htmlCell,
	}).Parse(reportTmpl))
)

// htmlCell renders a table cell "455µs (380µs–573µs) !" as the figure
// with its range on a line below it, smaller, so that a narrow table
// wraps between the two and nowhere else.
func htmlCell(cell string) template.HTML {
	cell = strings.TrimSuffix(cell, noisyMark)
	value, rng, ok := strings.Cut(cell, " (")
	if !ok || !strings.HasSuffix(rng, ")") {
		return template.HTML(template.HTMLEscapeString(cell))
	}
	return template.HTML(template.HTMLEscapeString(value) + `<span class="rng">` +
		template.HTMLEscapeString(strings.TrimSuffix(rng, ")")) + `</span>`)
}

// htmlData is what the page's script draws: per backend and client, the
// latency quantiles in ms and the throughputs with their ranges over the
// rounds.
type htmlData struct {
	Series []htmlSeries `json:"series"`
}

type htmlSeries struct {
	Backend string `json:"backend"`
	Client  string `json:"client"`
	// InProcess is set for the memory backend: it runs in this process, a
	// hundred times as fast as any server, and gets a chart of its own.
	InProcess   bool      `json:"inProcess,omitempty"`
	Uncontended []float64 `json:"uncontended,omitempty"` // ms at the 0th..100th percentile
	Handoff     []float64 `json:"handoff,omitempty"`
	Contended   *htmlOps  `json:"contended,omitempty"`
	Independent *htmlOps  `json:"independent,omitempty"`
}

// htmlOps is a throughput and its lowest and highest round.
type htmlOps struct {
	Ops float64 `json:"ops"`
	Lo  float64 `json:"lo"`
	Hi  float64 `json:"hi"`
}

func opsOf(t *Throughput) *htmlOps {
	if t == nil || t.OpsPerSec <= 0 {
		return nil
	}
	o := &htmlOps{Ops: t.OpsPerSec, Lo: t.OpsPerSec, Hi: t.OpsPerSec}
	if len(t.RoundOpsPerSec) > 0 {
		o.Lo, o.Hi = span(t.RoundOpsPerSec)
	}
	return o
}

func ms(q []time.Duration) []float64 {
	if len(q) == 0 {
		return nil
	}
	out := make([]float64, len(q))
	for i, d := range q {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// inProcess names the backends that run in this process.
func inProcess(backend string) bool { return backend == "memory" }

// WriteHTML writes the report as one self-contained HTML page: latency
// distributions (CDF) per scenario; throughput bars of dlock against each
// backend's floor (and peers), with each round's spread, the servers on a
// chart of their own (a log axis where they span a decade or more) and the
// in-process memory backend on another; a table per backend; the
// side-by-side tables with the peers when there are; the settings, the
// machine and its load.
func (r *Report) WriteHTML(w io.Writer) error {
	var d htmlData
	for _, b := range r.Backends {
		for _, res := range b.results() {
			s := htmlSeries{Backend: b.Backend, Client: res.Client, InProcess: inProcess(b.Backend),
				Contended: opsOf(res.Contended), Independent: opsOf(res.Independent)}
			if res.Uncontended != nil {
				s.Uncontended = ms(res.Uncontended.Quantiles)
			}
			if res.Handoff != nil {
				s.Handoff = ms(res.Handoff.Quantiles)
			}
			d.Series = append(d.Series, s)
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		return err
	}
	var servers, local bool
	for _, b := range r.Backends {
		if inProcess(b.Backend) {
			local = true
		} else {
			servers = true
		}
	}
	return htmlTmpl.Execute(w, struct {
		R          *Report
		Settings   string
		Machine    string
		Notes      []string
		Blocks     []block
		Data       template.JS
		ChartJS    template.JS
		PeersTitle string
		Peers      []peerTable
		Servers    bool
		InProcess  bool
		NoisyMark  string
	}{r, r.settings(), r.machineLoad(), r.notes(), r.blocks(), template.JS(data), template.JS(chartJS), peersTitle,
		r.peerTables(), servers, local, noisyMark})
}
