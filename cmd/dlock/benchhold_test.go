package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

// dlock bench hold on a real server: every lease held and none lost, the
// connections counted, and a row per N.
func TestBenchHoldRedis(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	jsonPath := filepath.Join(t.TempDir(), "hold.json")
	code, out, errOut := runCmd(t, "bench", "hold", "-backends", "redis", "-url", "redis=redis://"+addr+"/0",
		"-n", "10,50", "-hold", "500ms", "-ttl", "1s", "-hog", "1", "-o", jsonPath, "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "with 1 CPU-bound processes") {
		t.Errorf("-hog 1 not reported in:\n%s", out)
	}
	rows := 0
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "redis" {
			continue
		}
		rows++
		// backend N TTL acquired acquire cpu server-cpu conns heap "B" lost release
		if len(f) != 12 || f[1] != f[3] || f[10] != "0" || f[7] == "0" || f[7] == "-" {
			t.Errorf("row %q: want every lease acquired, none lost, connections counted", f)
		}
	}
	if rows != 2 {
		t.Fatalf("%d redis rows in:\n%s", rows, out)
	}
	// -o: the same rows as JSON.
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Hogs    int
		Results []struct {
			Backend        string
			N, Acquired    int
			Lost           int
			HeapPerLease   int64  `json:"heap_per_lease_bytes"`
			ProcessCPUText string `json:"process_cpu_per_min"`
		}
	}
	if err := json.Unmarshal(b, &report); err != nil {
		t.Fatalf("-o hold.json: %v in:\n%s", err, b)
	}
	if report.Hogs != 1 || len(report.Results) != 2 {
		t.Fatalf("-o hold.json: hogs %d, %d results, want 1 and 2:\n%s", report.Hogs, len(report.Results), b)
	}
	for _, r := range report.Results {
		if r.Backend != "redis" || r.Acquired != r.N || r.Lost != 0 || r.ProcessCPUText == "" {
			t.Errorf("-o hold.json: result %+v", r)
		}
	}
	// -params reaches the URL: a pool of 2 holds every lease on 2
	// connections, beside the Locker's pub/sub connection, which listens
	// for steals of its leases. (The command removed the servers of this
	// process when it ended: a new one.)
	addr = dlocktest.RequireNew(t, dlocktest.Redis).Addr()
	code, out, errOut = runCmd(t, "bench", "hold", "-backends", "redis", "-url", "redis=redis://"+addr+"/0",
		"-params", "redis=pool_size=2", "-n", "50", "-hold", "300ms", "-ttl", "1s", "-q")
	if code != 0 {
		t.Fatalf("-params: status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) == 12 && f[0] == "redis" && f[7] != "3" {
			t.Errorf("with pool_size=2: %s connections, want 3 (2 for the pool, 1 for pub/sub)", f[7])
		}
	}
	if code, _, _ := runCmd(t, "bench", "hold", "-n", "0"); code != 2 {
		t.Errorf("-n 0: status %d, want 2", code)
	}
	if code, _, _ := runCmd(t, "bench", "hold", "-o", "hold.html"); code != 2 {
		t.Errorf("-o hold.html: status %d, want 2", code)
	}
	if code, _, _ := runCmd(t, "bench", "hold", "-hog", "-1"); code != 2 {
		t.Errorf("-hog -1: status %d, want 2", code)
	}
}

// A postgres Locker with a connection per lease and a pool of 4 cannot hold
// 20 leases: the bench stops at the pool's limit (not at its budget), shows
// no heap per lease, and says what to set.
func TestBenchHoldPostgresShort(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.Postgres)
	url := "postgres://" + dlocktest.PostgresUser + ":" + dlocktest.PostgresPassword + "@" + srv.Addr() + "/" +
		dlocktest.PostgresDatabase + "?sslmode=disable"
	start := time.Now()
	code, out, errOut := runCmd(t, "bench", "hold", "-backends", "postgres", "-url", "postgres="+url,
		"-params", "postgres=shared_sessions=false&pool_max_conns=4", "-n", "20", "-hold", "200ms", "-budget", "60s", "-q")
	if code != 1 {
		t.Fatalf("status %d, want 1; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("took %v: the bench waited for its budget instead of stopping at the pool's limit", took)
	}
	for _, want := range []string{"postgres N=20: held", "shared_sessions=true", "pool_max_conns"} {
		if !strings.Contains(out, want) || !strings.Contains(errOut, want) {
			t.Errorf("stdout or stderr lacks %q:\nstdout:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 8 && f[0] == "postgres" && (f[3] == "20" || f[8] != "-") {
			t.Errorf("row %q: want fewer than 20 held and no heap per lease", line)
		}
	}
}
