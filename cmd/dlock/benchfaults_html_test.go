package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// timelineProbeJS is added to a copy of the faults page: once it has loaded,
// it counts each timeline's marks by class that the browser laid out at
// least a pixel wide, and measures the page and its tables.
const timelineProbeJS = `<script>
window.addEventListener("load", function () {
  var out = {viewport: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, timelines: [], tables: []};
  document.querySelectorAll("svg.timeline").forEach(function (svg) {
    var marks = {}, box = svg.getBoundingClientRect();
    svg.querySelectorAll("rect").forEach(function (r) {
      var b = r.getBoundingClientRect();
      if (b.width >= 1 && b.height >= 1) r.getAttribute("class").split(" ").forEach(function (c) { marks[c] = (marks[c] || 0) + 1; });
    });
    out.timelines.push({label: svg.getAttribute("aria-label"), width: box.width, height: box.height, marks: marks});
  });
` + probeEnd

// `dlock bench faults -sanity -o page.html` on a real Redis writes one
// self-contained page: headless Chromium lays out, without a script error
// and asking the network for nothing, a timeline whose lanes (one per
// client) carry held intervals, the fault windows and, since the sanity
// mode's locks do not exclude each other, overlaps in red; the page and its
// table fit a 1280 px window; a screenshot shows the held and overlap
// colours.
func TestBenchFaultsHTMLInChromium(t *testing.T) {
	browser := chromium(t)
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	page := filepath.Join(t.TempDir(), "faults.html")
	code, out, errOut := runCmd(t, "bench", "faults", "-backends", "redis", "-url", "redis=redis://"+addr+"/0", "-sanity",
		"-duration", "3s", "-ttl", "500ms", "-hold", "200ms", "-seed", "5", "-o", page, "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	offline(t, html)
	out, _ = probed(t, browser, html, timelineProbeJS)
	var p struct {
		Viewport    float64 `json:"viewport"`
		ScrollWidth float64 `json:"scrollWidth"`
		Timelines   []struct {
			Label  string         `json:"label"`
			Width  float64        `json:"width"`
			Height float64        `json:"height"`
			Marks  map[string]int `json:"marks"`
		} `json:"timelines"`
		Tables []struct {
			Width float64 `json:"width"`
			Room  float64 `json:"room"`
		} `json:"tables"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("probe: %v in %s", err, out)
	}
	if len(p.Timelines) != 1 {
		t.Fatalf("%d timelines drawn, want 1 (dlock's row): %s", len(p.Timelines), out)
	}
	tl := p.Timelines[0]
	switch mk := tl.Marks; {
	case tl.Width < 600 || tl.Height < 40:
		t.Errorf("timeline %q is %.0f×%.0f px", tl.Label, tl.Width, tl.Height)
	case mk["lane"] != 2:
		t.Errorf("timeline marks %v: want a lane per client (2)", mk)
	case mk["held"] == 0, mk["overlap"] == 0:
		t.Errorf("timeline marks %v: want held intervals and, in sanity mode, overlaps", mk)
	case mk["fault-blackhole"]+mk["fault-reset"]+mk["fault-latency"] == 0:
		t.Errorf("timeline marks %v: want the proxy faults' windows", mk)
	}
	if p.ScrollWidth > p.Viewport+1 {
		t.Errorf("the page is %.0f px wide in a %.0f px window", p.ScrollWidth, p.Viewport)
	}
	for i, tb := range p.Tables {
		if tb.Width > tb.Room+1 {
			t.Errorf("table %d is %.0f px wide in %.0f px", i, tb.Width, tb.Room)
		}
	}

	colours, _, _ := screenshot(t, browser, page, "faults", 1)
	// The overlaps' red (#d62728) and the held intervals' blue (#1f6fb4).
	if colours[[3]uint32{0xd6, 0x27, 0x28}] < 20 || colours[[3]uint32{0x1f, 0x6f, 0xb4}] < 20 {
		t.Errorf("the screenshot lacks the overlaps' red or the held intervals' blue (%d red, %d blue px)",
			colours[[3]uint32{0xd6, 0x27, 0x28}], colours[[3]uint32{0x1f, 0x6f, 0xb4}])
	}
}
