package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// TestBenchFleet runs a small fleet on Redis: member processes (this test
// binary as dlock) start, hold their leases, idle and stop; the report has
// a row per size with figures, and no lease is lost.
func TestBenchFleet(t *testing.T) {
	t.Setenv("DLOCK_TEST_MAIN", "1") // the members run this binary as dlock
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	out := filepath.Join(t.TempDir(), "fleet.json")
	code, stdout, stderr := runCmd(t, "bench", "fleet", "-backends", "redis", "-url", "redis=redis://"+addr+"/0",
		"-p", "1,3", "-n", "20", "-hold", "2", "-idle", "100ms", "-q", "-o", out)
	if code != 0 {
		t.Fatalf("status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Backend string
			P       int   `json:"processes"`
			P50     int64 `json:"p50_ns"`
			Conns   int   `json:"connections"`
			Watches int
			Lost    int
			Errors  []string
		}
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, b)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("got %d rows, want 2 (P=1, P=3):\n%s", len(rep.Results), b)
	}
	for i, r := range rep.Results {
		if r.Backend != "redis" || r.P != []int{1, 3}[i] || r.P50 <= 0 || len(r.Errors) > 0 || r.Lost != 0 {
			t.Errorf("row %d = %+v, want redis at P=%d measured, nothing lost", i, r, []int{1, 3}[i])
		}
	}
	// Every member keeps its client's connection while it holds leases.
	if r := rep.Results[1]; r.Conns >= 0 && r.Conns < 3 {
		t.Errorf("P=3: %d connections to the server, want at least one per process", r.Conns)
	}
	if !strings.Contains(stdout, "p50 ×P=1") {
		t.Errorf("the text table lacks its ratio column:\n%s", stdout)
	}
}

// TestBenchFleetUsage refuses bad sizes and the in-process backend before
// starting anything.
func TestBenchFleetUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "fleet", "-p", "10,1"},
		{"bench", "fleet", "-p", "0"},
		{"bench", "fleet", "-backends", "memory"},
		{"bench", "fleet", "-n", "0"},
		{"bench", "fleet-member"},
	} {
		if code, _, stderr := runCmd(t, args...); code != 2 {
			t.Errorf("%v: status %d, want 2 (stderr %q)", args, code, stderr)
		}
	}
}
