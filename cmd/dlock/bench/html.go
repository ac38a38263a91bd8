package bench

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"io"
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
	}).Parse(reportTmpl))
)

// htmlData is what the page's script draws: per backend and client, the
// latency quantiles in ms and the throughputs.
type htmlData struct {
	Series []htmlSeries `json:"series"`
}

type htmlSeries struct {
	Backend     string    `json:"backend"`
	Client      string    `json:"client"`
	Uncontended []float64 `json:"uncontended,omitempty"` // ms at the 0th..100th percentile
	Handoff     []float64 `json:"handoff,omitempty"`
	Contended   float64   `json:"contended"` // ops/s
	Independent float64   `json:"independent"`
	Fairness    float64   `json:"fairness"`
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

// WriteHTML writes the report as one self-contained HTML page: latency
// distributions (CDF) per scenario, throughput bars of dlock against each
// backend's floor (and peers), the table, the side-by-side tables with the
// peers when there are, the settings and the machine.
func (r *Report) WriteHTML(w io.Writer) error {
	var d htmlData
	for _, b := range r.Backends {
		for _, res := range b.results() {
			s := htmlSeries{Backend: b.Backend, Client: res.Client}
			if res.Uncontended != nil {
				s.Uncontended = ms(res.Uncontended.Quantiles)
			}
			if res.Handoff != nil {
				s.Handoff = ms(res.Handoff.Quantiles)
			}
			if res.Contended != nil {
				s.Contended, s.Fairness = res.Contended.OpsPerSec, res.Contended.Fairness
			}
			if res.Independent != nil {
				s.Independent = res.Independent.OpsPerSec
			}
			d.Series = append(d.Series, s)
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return htmlTmpl.Execute(w, struct {
		R          *Report
		Settings   string
		Notes      []string
		Rows       [][]string
		Header     []string
		Data       template.JS
		ChartJS    template.JS
		PeersTitle string
		Peers      []peerTable
	}{r, r.settings(), r.notes(), r.rows(), header, template.JS(data), template.JS(chartJS), peersTitle, r.peerTables()})
}
