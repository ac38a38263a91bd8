package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

// chromium returns the headless browser's path: it fails the test when
// DLOCK_REQUIRE_BACKENDS=1 (CI) and the browser is missing, and skips it
// otherwise.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if v, _ := strconv.ParseBool(os.Getenv(dlocktest.RequireBackendsEnv)); v {
		t.Fatal("chromium is not installed (scripts/test.sh installs it: apt-get install chromium)")
	}
	t.Skip("chromium is not installed")
	return ""
}

// headless runs chromium on the page with args and returns its stdout.
func headless(t *testing.T, browser, page string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--user-data-dir=" + t.TempDir(),
		"--window-size=1280,2000", "--virtual-time-budget=10000"}, args...)
	c := exec.CommandContext(ctx, browser, append(all, "file://"+page)...)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errOut.String())
	}
	// Console errors show in chromium's log on stderr.
	if strings.Contains(errOut.String(), "Uncaught") {
		t.Errorf("the page threw in the browser:\n%s", errOut.String())
	}
	return out.Bytes()
}

// probeJS is added to a copy of the page, after its own scripts: once the
// page has loaded it reads what Chart.js laid out (every chart's bars,
// axis ticks and legend) and the page's widths, and writes them as JSON
// into the DOM, where --dump-dom shows them. It reads the charts through
// Chart.js's public API only, so that it works on any page that draws with
// Chart.js, the reports of older versions included.
const probeJS = `<script>
window.addEventListener("load", function () {
  var out = {viewport: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, charts: [], tables: []};
  Object.values(Chart.instances).forEach(function (c) {
    var ch = {id: c.canvas.id, type: c.config.type, height: c.chartArea.bottom - c.chartArea.top, bars: [], scales: [], legend: []};
    c.data.datasets.forEach(function (ds, i) {
      var meta = c.getDatasetMeta(i);
      if (meta.type !== "bar" || meta.hidden) return;
      meta.data.forEach(function (el, j) {
        var v = ds.data[j];
        if (v === null || v === undefined) return;
        if (typeof v === "object") v = v.y;
        var p = el.getProps(["y", "base"], true);
        ch.bars.push({label: (c.data.labels[j] || "") + " " + (ds.label || ""), value: v, px: Math.abs(p.base - p.y)});
      });
    });
    Object.values(c.scales).forEach(function (s) {
      var font = Chart.helpers.toFont(s.options.ticks.font);
      c.ctx.save(); c.ctx.font = font.string;
      var ticks = s.ticks.map(function (t, i) {
        var label = Array.isArray(t.label) ? t.label.join(" ") : String(t.label === undefined ? "" : t.label);
        return {label: label, px: s.getPixelForTick(i), width: c.ctx.measureText(label).width};
      });
      c.ctx.restore();
      ch.scales.push({id: s.id, type: s.type, horizontal: s.isHorizontal(), rotation: s.labelRotation || 0,
        font: font.lineHeight, display: s.options.display !== false && s.options.ticks.display !== false, ticks: ticks});
    });
    if (c.legend && c.legend.legendItems) c.legend.legendItems.forEach(function (li) {
      ch.legend.push({text: li.text, dashed: !!(li.lineDash && li.lineDash.length), pointStyle: String(li.pointStyle || ""),
        usePointStyle: !!c.legend.options.labels.usePointStyle, styleWidth: c.legend.options.labels.pointStyleWidth || 0});
    });
    out.charts.push(ch);
  });
` + probeEnd

// probeEnd ends a probe script whose load handler has filled out: it
// measures the page's tables and writes out as JSON into the DOM, where
// --dump-dom shows it.
const probeEnd = `  document.querySelectorAll("table").forEach(function (t) {
    var box = t.parentElement.getBoundingClientRect();
    out.tables.push({width: t.scrollWidth, room: Math.min(box.width, window.innerWidth)});
  });
  var s = document.createElement("script");
  s.type = "application/json"; s.id = "dlock-probe";
  s.textContent = JSON.stringify(out).replace(/</g, "\\u003c");
  document.body.appendChild(s);
});
</script>`

// probe is what probeJS reports.
type probe struct {
	Viewport    float64 `json:"viewport"`
	ScrollWidth float64 `json:"scrollWidth"`
	Charts      []struct {
		ID     string  `json:"id"`
		Type   string  `json:"type"`
		Height float64 `json:"height"`
		Bars   []struct {
			Label string  `json:"label"`
			Value float64 `json:"value"`
			Px    float64 `json:"px"`
		} `json:"bars"`
		Scales []struct {
			ID         string  `json:"id"`
			Type       string  `json:"type"`
			Horizontal bool    `json:"horizontal"`
			Rotation   float64 `json:"rotation"`
			Font       float64 `json:"font"`
			Display    bool    `json:"display"`
			Ticks      []struct {
				Label string  `json:"label"`
				Px    float64 `json:"px"`
				Width float64 `json:"width"`
			} `json:"ticks"`
		} `json:"scales"`
		Legend []struct {
			Text          string `json:"text"`
			Dashed        bool   `json:"dashed"`
			PointStyle    string `json:"pointStyle"`
			UsePointStyle bool   `json:"usePointStyle"`
			StyleWidth    int    `json:"styleWidth"`
		} `json:"legend"`
	} `json:"charts"`
	Tables []struct {
		Width float64 `json:"width"`
		Room  float64 `json:"room"`
	} `json:"tables"`
}

// minBarPx is the least height, in pixels, of a bar that shows a value: a
// chart whose bars are thinner says nothing about them.
const minBarPx = 4

// sigDigits counts the significant digits of a numeric tick label
// ("300.0000" has 7, "0.0003" 1, "1,000" 1), or returns 0 for a label with
// no number.
func sigDigits(label string) int {
	num := regexp.MustCompile(`[0-9][0-9,]*(\.[0-9]+)?`).FindString(label)
	if num == "" {
		return 0
	}
	num = strings.ReplaceAll(num, ",", "")
	intPart, frac, dotted := strings.Cut(num, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if !dotted {
		digits = strings.TrimRight(digits, "0")
	}
	return max(len(digits), 1)
}

// checkRendered lists what makes the rendered page hard to read: bars too
// thin to see, tick labels with more digits than a reader can use or
// overlapping their neighbours, dashed series whose legend swatch is a
// dashed box rather than a line, a page or table wider than the window.
func checkRendered(p probe) []string {
	var bad []string
	errorf := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if p.ScrollWidth > p.Viewport+1 {
		errorf("the page is %.0f px wide in a %.0f px window", p.ScrollWidth, p.Viewport)
	}
	for i, tb := range p.Tables {
		if tb.Width > tb.Room+1 {
			errorf("table %d is %.0f px wide in %.0f px: cut off behind a scrollbar", i, tb.Width, tb.Room)
		}
	}
	for _, c := range p.Charts {
		for _, b := range c.Bars {
			if b.Value > 0 && b.Px < minBarPx {
				errorf("chart %s: bar %q (%g) is %.1f px tall in a %.0f px plot, want at least %d",
					c.ID, b.Label, b.Value, b.Px, c.Height, minBarPx)
			}
		}
		for _, s := range c.Scales {
			if !s.Display {
				continue
			}
			for j, tk := range s.Ticks {
				if n := sigDigits(tk.Label); n > 3 {
					errorf("chart %s axis %s: tick label %q has %d significant digits, want at most 3", c.ID, s.ID, tk.Label, n)
				}
				if j == 0 || tk.Label == "" {
					continue
				}
				prev := s.Ticks[j-1]
				if prev.Label == "" {
					continue
				}
				gap := math.Abs(tk.Px - prev.Px)
				// The room the two labels need along the axis: half of
				// each one's extent, which is its width on a horizontal
				// axis with unrotated labels, and the line height
				// otherwise (over the sine of the rotation).
				need := s.Font
				switch {
				case s.Horizontal && s.Rotation == 0:
					need = (tk.Width + prev.Width) / 2
				case s.Horizontal:
					need = s.Font / math.Sin(s.Rotation*math.Pi/180)
				}
				if gap < need {
					errorf("chart %s axis %s: tick labels %q and %q overlap (%.0f px apart, need %.0f)",
						c.ID, s.ID, prev.Label, tk.Label, gap, need)
				}
			}
		}
		for _, l := range c.Legend {
			if l.Dashed && (!l.UsePointStyle || l.PointStyle != "line" || l.StyleWidth < 20) {
				errorf("chart %s: legend %q draws a dashed series as a dashed box (usePointStyle %v, pointStyle %q, width %d), want a line sample",
					c.ID, l.Text, l.UsePointStyle, l.PointStyle, l.StyleWidth)
			}
		}
	}
	return bad
}

// probed opens a copy of page with the probe script js added after its
// own scripts, and returns the JSON the probe wrote into the DOM (in a
// script element of id dlock-probe), and the DOM.
func probed(t *testing.T, browser string, html []byte, js string) (string, string) {
	t.Helper()
	i := bytes.LastIndex(html, []byte("</body>"))
	if i < 0 {
		t.Fatal("the page has no </body>")
	}
	page := filepath.Join(t.TempDir(), "probed.html")
	withProbe := append(append(append([]byte{}, html[:i]...), js...), html[i:]...)
	if err := os.WriteFile(page, withProbe, 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(headless(t, browser, page, "--dump-dom"))
	m := regexp.MustCompile(`(?s)<script type="application/json" id="dlock-probe">(.*?)</script>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the probe wrote nothing: the page did not load, or lacks what the probe reads")
	}
	return m[1], dom
}

// renderProbe opens a copy of page with probeJS added and returns what it
// reports, and the DOM.
func renderProbe(t *testing.T, browser string, html []byte) (probe, string) {
	t.Helper()
	out, dom := probed(t, browser, html, probeJS)
	var p probe
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("probe: %v in %s", err, out)
	}
	return p, dom
}

// offline fails the test if the page loads anything from the network.
func offline(t *testing.T, html []byte) {
	t.Helper()
	if m := regexp.MustCompile(`(?i)(src|href)=["']?(https?:)?//`).Find(html); m != nil {
		t.Errorf("the page loads %q from the network", m)
	}
}

// screenshot takes page's screenshot in a 1280 px window (kept, with the
// page, as name.png and name.html in DLOCK_SCREENSHOT_DIR when set) and
// counts its pixels by colour, every step-th in each direction.
func screenshot(t *testing.T, browser, page, name string, step int) (colours map[[3]uint32]int, width, height int) {
	t.Helper()
	shot := filepath.Join(t.TempDir(), "shot.png")
	headless(t, browser, page, "--screenshot="+shot, "--hide-scrollbars")
	if dir := os.Getenv("DLOCK_SCREENSHOT_DIR"); dir != "" {
		b, _ := os.ReadFile(shot)
		_ = os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644)
		html, _ := os.ReadFile(page)
		_ = os.WriteFile(filepath.Join(dir, name+".html"), html, 0o644)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	colours = map[[3]uint32]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += step {
		for x := b.Min.X; x < b.Max.X; x += step {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, bl >> 8}]++
		}
	}
	return colours, b.Dx(), b.Dy()
}

// `dlock bench -html` on memory and a real Redis writes one self-contained
// page; headless Chromium draws its charts without a script error, the
// page asks the network for nothing, and what it draws can be read: every
// bar at least a few pixels tall, tick labels short and apart, dashed
// series drawn as lines in the legends, the tables within a 1280 px window
// (checkRendered, from the charts' own geometry); a screenshot has the
// charts' colours in it.
func TestBenchHTMLInChromium(t *testing.T) {
	browser := chromium(t)
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	page := filepath.Join(t.TempDir(), "report.html")
	args := append([]string{"bench", "-backends", "memory,redis", "-url", "redis=redis://" + addr + "/0", "-html", page, "-q"}, small...)
	if code, _, stderr := runCmd(t, args...); code != 0 {
		t.Fatalf("bench: status %d; stderr:\n%s", code, stderr)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	offline(t, html)
	t.Logf("page: %d bytes", len(html))

	p, dom := renderProbe(t, browser, html)
	if !strings.Contains(dom, `data-errors=""`) {
		t.Errorf("script errors on the page: %s", regexp.MustCompile(`data-errors="[^"]*"`).FindString(dom))
	}
	kinds := map[string]int{}
	for _, c := range p.Charts {
		kinds[c.Type]++
	}
	if kinds["scatter"] < 2 || kinds["bar"] < 2 {
		t.Errorf("charts drawn: %v, want at least 2 latency CDFs (scatter) and 2 throughput bar charts", kinds)
	}
	for _, e := range checkRendered(p) {
		t.Error(e)
	}
	for _, name := range []string{"memory", "redis"} {
		if !strings.Contains(dom, name) {
			t.Errorf("the page does not mention %s", name)
		}
	}

	colours, w, h := screenshot(t, browser, page, "report", 2)
	// The bars' dlock blue (#3182bd) and the first series' line (#1f77b4).
	if colours[[3]uint32{0x31, 0x82, 0xbd}] < 50 || colours[[3]uint32{0x1f, 0x77, 0xb4}] < 20 {
		t.Errorf("the screenshot lacks the charts' colours (%d distinct colours)", len(colours))
	}
	t.Logf("screenshot %dx%d, %d distinct colours", w, h, len(colours))
}

// The checks of checkRendered themselves, on made-up geometry: each one
// catches what it is meant to, and a readable page passes.
func TestCheckRendered(t *testing.T) {
	for _, c := range []struct {
		label string
		want  int
	}{
		{"300.0000", 7}, {"0.0003", 1}, {"70.0000", 6}, {"1,000", 1}, {"250µs", 2}, {"1.25ms", 3}, {"100k", 1}, {"memory", 0},
	} {
		if got := sigDigits(c.label); got != c.want {
			t.Errorf("sigDigits(%q) = %d, want %d", c.label, got, c.want)
		}
	}
	good := `{"viewport":1280,"scrollWidth":1280,"tables":[{"width":900,"room":1200}],"charts":[
	  {"id":"bars","type":"bar","height":250,"bars":[{"label":"redis dlock","value":39,"px":60},{"label":"etcd dlock","value":1176,"px":200}],
	   "scales":[{"id":"x","horizontal":true,"font":14,"display":true,"ticks":[{"label":"redis","px":100,"width":30},{"label":"etcd","px":200,"width":25}]},
	             {"id":"y","horizontal":false,"font":14,"display":true,"ticks":[{"label":"10","px":250},{"label":"100","px":170},{"label":"1,000","px":90}]}]},
	  {"id":"cdf","type":"scatter","height":250,"scales":[{"id":"x","horizontal":true,"font":14,"display":true,
	     "ticks":[{"label":"300µs","px":50,"width":34},{"label":"1ms","px":120,"width":22}]}],
	   "legend":[{"text":"redis floor","dashed":true,"pointStyle":"line","usePointStyle":true,"styleWidth":40}]}]}`
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"readable", "", "", ""},
		{"flat bar", `"value":39,"px":60`, `"value":39,"px":0.3`, "0.3 px tall"},
		{"long tick", `"label":"300µs"`, `"label":"300.0000"`, "7 significant digits"},
		{"overlap", `"px":120,"width":22`, `"px":70,"width":22`, "overlap"},
		{"vertical overlap", `"label":"100","px":170`, `"label":"100","px":245`, "overlap"},
		{"dashed box", `"usePointStyle":true`, `"usePointStyle":false`, "dashed box"},
		{"wide table", `"width":900`, `"width":1300`, "cut off"},
		{"wide page", `"scrollWidth":1280`, `"scrollWidth":1500`, "1500 px wide"},
	} {
		var p probe
		if err := json.Unmarshal([]byte(strings.Replace(good, c.from, c.to, 1)), &p); err != nil {
			t.Fatal(err)
		}
		bad := checkRendered(p)
		switch {
		case c.want == "" && len(bad) > 0:
			t.Errorf("%s: %q, want nothing", c.name, bad)
		case c.want != "" && (len(bad) != 1 || !strings.Contains(bad[0], c.want)):
			t.Errorf("%s: %q, want one complaint with %q", c.name, bad, c.want)
		}
	}
}
