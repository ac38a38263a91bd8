package bench

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// loadAverage is the machine's load average over 1, 5 and 15 minutes from
// /proc/loadavg, nil where there is none.
func loadAverage() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	return parseLoadAverage(string(b))
}

// parseLoadAverage reads the first three fields of /proc/loadavg.
func parseLoadAverage(s string) []float64 {
	f := strings.Fields(s)
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil
		}
		out[i] = v
	}
	return out
}

// cpuModel is the CPU's model name from /proc/cpuinfo, "" where there is
// none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// osName is the distribution's PRETTY_NAME from /etc/os-release, with the
// kernel's GOOS/GOARCH.
func osName() string {
	name := runtime.GOOS + "/" + runtime.GOARCH
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return name
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`) + " (" + name + ")"
		}
	}
	return name
}

// dlockVersion is the version of the dlock module in this binary.
func dlockVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if bi.Main.Path == "github.com/dlock/dlock" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/dlock/dlock" {
			return d.Version
		}
	}
	return ""
}
