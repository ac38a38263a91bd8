package main

import (
	"bytes"
	"context"
	"image/png"
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

// `dlock bench -html` on memory and a real Redis writes one self-contained
// page; headless Chromium draws its four charts (canvases sized by Chart.js,
// a screenshot with the charts' colours in it) without a script error, and
// the page asks the network for nothing.
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
	if m := regexp.MustCompile(`(?i)(src|href)=["']?(https?:)?//`).Find(html); m != nil {
		t.Errorf("the page loads %q from the network", m)
	}
	t.Logf("page: %d bytes", len(html))

	dom := string(headless(t, browser, page, "--dump-dom"))
	if got := regexp.MustCompile(`data-charts="(\d+)"`).FindStringSubmatch(dom); got == nil || got[1] != "4" {
		t.Errorf("charts drawn: %v, want 4", got)
	}
	if !strings.Contains(dom, `data-errors=""`) {
		t.Errorf("script errors on the page: %s", regexp.MustCompile(`data-errors="[^"]*"`).FindString(dom))
	}
	canvases := regexp.MustCompile(`<canvas[^>]*id="(cdf|bars)-[a-z]+"[^>]*height="(\d+)"`).FindAllStringSubmatch(dom, -1)
	if len(canvases) != 4 {
		t.Errorf("%d canvases sized by Chart.js, want 4", len(canvases))
	}
	for _, name := range []string{"memory dlock", "redis floor"} {
		if !strings.Contains(dom, name) && !strings.Contains(string(html), strings.Fields(name)[0]) {
			t.Errorf("the page does not mention %s", name)
		}
	}

	shot := filepath.Join(t.TempDir(), "shot.png")
	headless(t, browser, page, "--screenshot="+shot, "--hide-scrollbars")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	colours := map[[3]uint32]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, bl >> 8}]++
		}
	}
	// The bars' dlock blue (#3182bd) and the first series' line (#1f77b4).
	if colours[[3]uint32{0x31, 0x82, 0xbd}] < 50 || colours[[3]uint32{0x1f, 0x77, 0xb4}] < 20 {
		t.Errorf("the screenshot lacks the charts' colours (%d distinct colours)", len(colours))
	}
	t.Logf("screenshot %dx%d, %d distinct colours", b.Dx(), b.Dy(), len(colours))
}
