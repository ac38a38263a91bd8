package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// faultsRow is the part of a -json row the tests read.
type faultsRow struct {
	Backend, Library string
	FaultsRan        string `json:"faults_ran"`
	Faults           map[string]int
	Grants           int
	Overlaps         int
	Fenced           bool
	FencedRefused    int            `json:"fenced_refused"`
	OutOfOrder       int            `json:"unfenced_out_of_order"`
	LossesUnreported int            `json:"losses_unreported"`
	LossesReported   int            `json:"losses_reported"`
	Excused          int            `json:"overlaps_excused"`
	Why              map[string]int `json:"excused_by"`
	Recovery         int64          `json:"recovery_ns"`
	RecoveryAll      int64          `json:"recovery_all_ns"`
	Hung             int
	Errors           []string
}

func faultsJSON(t *testing.T, out string) (seed uint64, rows []faultsRow) {
	t.Helper()
	var rep struct {
		Seed uint64
		Rows []faultsRow
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("-json: %v in:\n%s", err, out)
	}
	return rep.Seed, rep.Rows
}

// dlock bench faults on memory: dlock's clients exclude each other (grants,
// no overlap); -sanity, where they do not, shows overlaps; the table has a
// dlock row; bad flags are usage errors.
func TestBenchFaultsMemory(t *testing.T) {
	code, out, errOut := runCmd(t, "bench", "faults", "-backends", "memory", "-duration", "400ms", "-ttl", "100ms", "-seed", "7", "-json", "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	seed, rows := faultsJSON(t, out)
	if seed != 7 || len(rows) != 1 {
		t.Fatalf("seed %d, %d rows; want 7 and 1:\n%s", seed, len(rows), out)
	}
	if r := rows[0]; r.Library != "dlock" || r.Grants == 0 || r.Overlaps != 0 || r.FencedRefused != 0 || r.OutOfOrder != 0 ||
		r.LossesUnreported != 0 || len(r.Errors) > 0 {
		t.Errorf("row %+v: want dlock granted with no overlap, refused or out-of-order write, unreported loss or error", r)
	}

	code, out, errOut = runCmd(t, "bench", "faults", "-backends", "memory", "-sanity", "-duration", "400ms", "-ttl", "100ms", "-json", "-q")
	if code != 0 {
		t.Fatalf("-sanity: status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if _, rows = faultsJSON(t, out); len(rows) != 1 || rows[0].Overlaps == 0 {
		t.Fatalf("-sanity: rows %+v, want one with overlaps", rows)
	}

	// The table.
	code, out, errOut = runCmd(t, "bench", "faults", "-backends", "memory", "-duration", "200ms", "-ttl", "100ms", "-q")
	if code != 0 {
		t.Fatalf("table: status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	found := false
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 4 && f[0] == "dlock" {
			found = true
		}
	}
	if !found || !strings.Contains(out, "overlaps") || !strings.Contains(out, "no path faults") {
		t.Errorf("table lacks the dlock row, its header or the faults that ran:\n%s", out)
	}

	for _, args := range [][]string{
		{"-clients", "0"}, {"-duration", "0s"}, {"-long", "2"}, {"-sanity", "-clients", "1"},
		{"-backends", "nosuch"}, {"-backends", "memory", "-url", "redis=redis://127.0.0.1:1/0"}, {"extra"},
	} {
		if code, _, errOut := runCmd(t, append([]string{"bench", "faults", "-q"}, args...)...); code != 2 {
			t.Errorf("%q: status %d, want 2; stderr:\n%s", args, code, errOut)
		}
	}
}

// dlock bench faults on a redis server given by -url: the proxy faults
// run (no server pause: the server is not the command's), dlock's row shows
// grants, faults, no overlap and recovery, and the peers' rows stand beside
// it with their configuration.
func TestBenchFaultsRedis(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	code, out, errOut := runCmd(t, "bench", "faults", "-backends", "redis", "-url", "redis=redis://"+addr+"/0",
		"-duration", "3s", "-ttl", "500ms", "-clients", "3", "-seed", "11", "-json", "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	_, rows := faultsJSON(t, out)
	libs := map[string]faultsRow{}
	for _, r := range rows {
		libs[r.Library] = r
		if r.Backend != "redis" || len(r.Errors) > 0 {
			t.Errorf("row %+v: want redis and no harness error", r)
		}
	}
	for _, want := range []string{"dlock", "redsync", "redislock"} {
		if _, ok := libs[want]; !ok {
			t.Errorf("no %s row in:\n%s", want, out)
		}
	}
	d := libs["dlock"]
	faults := 0
	for _, n := range d.Faults {
		faults += n
	}
	switch {
	case d.Grants == 0, faults == 0, d.Faults["pause"] != 0, !d.Fenced:
		t.Errorf("dlock row %+v: want grants, fencing, proxy faults and no pause", d)
	case d.Overlaps != 0, d.LossesUnreported != 0, d.OutOfOrder != 0, d.FencedRefused != 0:
		t.Errorf("dlock row %+v: want no overlap, unreported loss, refused or out-of-order write", d)
	case d.Recovery < 0, d.RecoveryAll < 0:
		t.Errorf("dlock row %+v: want every client granted after the last heal", d)
	case !strings.Contains(d.FaultsRan, "no server pause"):
		t.Errorf("faults ran: %q, want it to say the server was not paused", d.FaultsRan)
	}
}

// dlock bench faults on a Redis server it starts itself: the server faults
// run too (seed 3's schedule pauses the server, then restarts it), the
// table counts both, dlock's row shows no overlap but those the restart
// excuses (Redis keeps no lock across one), and every client is granted
// after the last heal.
func TestBenchFaultsServerRestart(t *testing.T) {
	code, out, errOut := runCmd(t, "bench", "faults", "-backends", "redis", "-peers=false",
		"-duration", "4s", "-ttl", "500ms", "-clients", "3", "-seed", "3", "-json", "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	_, rows := faultsJSON(t, out)
	if len(rows) != 1 || rows[0].Library != "dlock" || len(rows[0].Errors) > 0 {
		t.Fatalf("rows %+v: want dlock's alone, with no harness error", rows)
	}
	d := rows[0]
	switch {
	case d.Faults["pause"] == 0, d.Faults["restart"] == 0:
		t.Errorf("faults %v: want a pause and a restart", d.Faults)
	case !strings.Contains(d.FaultsRan, "pause and restart of the server"):
		t.Errorf("faults ran: %q, want it to say the server was paused and restarted", d.FaultsRan)
	case d.Overlaps != 0:
		t.Errorf("dlock row %+v: want no overlap but those a restart excuses", d)
	case d.Recovery < 0, d.RecoveryAll < 0:
		t.Errorf("dlock row %+v: want every client granted after the last heal", d)
	}
	t.Logf("faults %v, grants %d, overlaps excused %d %v, fenced refused %d, losses %d/%d",
		d.Faults, d.Grants, d.Excused, d.Why, d.FencedRefused, d.LossesReported, d.LossesUnreported)
}
