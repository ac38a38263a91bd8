package bench

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// The faults report's page draws each run's timeline as inline SVG, laid
// out here: it needs no script, and nothing from the network.

//go:embed faults.html.tmpl
var faultsTmplText string

var faultsTmpl = template.Must(template.New("faults").Parse(faultsTmplText))

// Timeline geometry, in the SVG's user units: the page scales it to its
// width.
const (
	tlWidth  = 1000.0 // the whole drawing
	tlLeft   = 72.0   // the lanes' labels
	tlRight  = 8.0
	tlTop    = 6.0
	tlLane   = 18.0 // a lane's height
	tlGap    = 4.0
	tlAxis   = 22.0 // room for the time axis below the lanes
	tlMinBar = 1.0  // the narrowest mark drawn, so that a short hold shows
)

// tlRect is one mark of a timeline.
type tlRect struct {
	Class      string
	X, Y, W, H float64
	Title      string
}

// tlText is a label of a timeline.
type tlText struct {
	X, Y   float64
	Anchor string
	Text   string
}

// tlView is a run's timeline laid out.
type tlView struct {
	Title     string
	Width     float64
	Height    float64
	Rects     []tlRect
	Labels    []tlText
	Overlaps  int
	Lanes     int
	ServerRow bool
}

// layout lays out row's timeline: a lane per client (and one for the
// servers when they were paused), the fault windows shaded in their lanes
// (a server's across all of them), the held intervals as bars, the
// overlaps in red on both clients' lanes, and a time axis.
func layout(row FaultsRow) *tlView {
	tl := row.Timeline
	if tl == nil || tl.End <= 0 {
		return nil
	}
	server := false
	for _, f := range tl.Faults {
		server = server || f.Client < 0
	}
	lanes := row.Clients
	if server {
		lanes++
	}
	v := &tlView{Title: row.Library, Width: tlWidth, Lanes: row.Clients, ServerRow: server}
	v.Height = tlTop + float64(lanes)*(tlLane+tlGap) + tlAxis
	plot := tlWidth - tlLeft - tlRight
	x := func(ms float64) float64 { return tlLeft + plot*math.Max(0, math.Min(ms, tl.End))/tl.End }
	laneY := func(client int) float64 {
		i := client
		if server {
			i++ // the servers' lane first
		}
		return tlTop + float64(i)*(tlLane+tlGap)
	}
	bottom := tlTop + float64(lanes)*(tlLane+tlGap) - tlGap
	add := func(class string, from, to, y, h float64, title string) {
		x0, x1 := x(from), x(to)
		w := math.Max(x1-x0, tlMinBar)
		v.Rects = append(v.Rects, tlRect{Class: class, X: round2(x0), Y: round2(y), W: round2(w), H: round2(h), Title: title})
	}
	// Lanes and their labels.
	if server {
		add("lane", 0, tl.End, laneY(-1), tlLane, "")
		v.Labels = append(v.Labels, tlText{X: tlLeft - 6, Y: laneY(-1) + tlLane*0.7, Anchor: "end", Text: "servers"})
	}
	for c := range row.Clients {
		add("lane", 0, tl.End, laneY(c), tlLane, "")
		v.Labels = append(v.Labels, tlText{X: tlLeft - 6, Y: laneY(c) + tlLane*0.7, Anchor: "end", Text: fmt.Sprintf("client %d", c)})
	}
	// Faults: a server's shades every lane.
	for _, f := range tl.Faults {
		title := fmt.Sprintf("%s %s–%s", f.Kind, sec(f.From), sec(f.To))
		if f.Client < 0 {
			add("fault-server fault-"+f.Kind, f.From, f.To, tlTop, bottom-tlTop, fmt.Sprintf("%s of %s %s–%s", f.Kind, f.Note, sec(f.From), sec(f.To)))
			continue
		}
		if f.Client >= row.Clients {
			continue
		}
		add("fault-"+f.Kind, f.From, f.To, laneY(f.Client), tlLane, fmt.Sprintf("client %d: %s", f.Client, title))
	}
	// Held intervals, inset in their lanes.
	for _, h := range tl.Held {
		if h.Client < 0 || h.Client >= row.Clients {
			continue
		}
		add("held held-"+h.Kind, h.From, h.To, laneY(h.Client)+4, tlLane-8,
			fmt.Sprintf("client %d held %s–%s, ended by %s", h.Client, sec(h.From), sec(h.To), h.Kind))
	}
	// Overlaps, over both lanes.
	for _, o := range tl.Overlaps {
		title := fmt.Sprintf("%s: client %d held while client %d was granted, %s–%s", o.Kind, o.Client, o.Other, sec(o.From), sec(o.To))
		for _, c := range []int{o.Client, o.Other} {
			if c >= 0 && c < row.Clients {
				add(o.Kind, o.From, o.To, laneY(c), tlLane, title)
			}
		}
		if o.Kind == "overlap" {
			v.Overlaps++
		}
	}
	// The end of the fault phase, and the time axis.
	if tl.Phase > 0 && tl.Phase < tl.End {
		add("phase", tl.Phase, tl.Phase, tlTop, bottom-tlTop, "the fault phase ends: each client takes the lock once more")
	}
	step := tickStep(tl.End)
	for t := 0.0; t <= tl.End+1e-9; t += step {
		add("tick", t, t, bottom, 4, "")
		anchor := "middle"
		if t == 0 {
			anchor = "start"
		}
		v.Labels = append(v.Labels, tlText{X: round2(x(t)), Y: bottom + 16, Anchor: anchor, Text: sec(t)})
	}
	return v
}

// tickStep is the time axis's step in ms: 1, 2 or 5 times a power of ten,
// about eight ticks over end.
func tickStep(end float64) float64 {
	raw := end / 8
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// sec formats ms as seconds, to the millisecond where it matters.
func sec(ms float64) string {
	s := ms / 1000
	if s == math.Trunc(s) {
		return fmt.Sprintf("%.0f s", s)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", s), "0"), ".") + " s"
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// WriteFaultsHTML writes the report as one self-contained page: per
// backend, its table, each library's configuration, and a timeline per
// library (a lane per client: held intervals, fault windows shaded,
// overlaps in red); then the notes.
func WriteFaultsHTML(w io.Writer, rep *FaultsReport) error {
	type section struct {
		faultsBlock
		Faults    string
		Timelines []*tlView
	}
	var sections []section
	for _, b := range rep.blocks() {
		s := section{faultsBlock: b}
		b.Head, s.Faults, _ = strings.Cut(b.Head, "\n")
		s.Head = b.Head
		for _, row := range b.Runs {
			if v := layout(row); v != nil {
				if row.Version != "" {
					v.Title += " " + row.Version
				}
				s.Timelines = append(s.Timelines, v)
			}
		}
		sections = append(sections, s)
	}
	return faultsTmpl.Execute(w, struct {
		R        *FaultsReport
		Title    string
		Sections []section
	}{rep, strings.ReplaceAll(rep.title(), "\n", " "), sections})
}
