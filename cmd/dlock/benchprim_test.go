package main

import (
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// `dlock bench primitives` measures every backend by default, those that
// offer none of the primitives too.
func TestBenchPrimitivesDefaultBackends(t *testing.T) {
	code, _, errOut := runCmd(t, "bench", "primitives", "-h")
	if code != 0 {
		t.Fatalf("-h: status %d", code)
	}
	want := `(default "` + strings.Join(backendNames(), ",") + `")`
	if !strings.Contains(errOut, want) || !strings.Contains(want, "redlock") {
		t.Errorf("-backends default is not every backend (%s):\n%s", want, errOut)
	}
}

// redlock offers no semaphore, read lock or election: its row is there,
// '-' in every column, and the notes name what it lacks.
func TestBenchPrimitivesRedlock(t *testing.T) {
	addrs := []string{dlocktest.Require(t, dlocktest.Redis).Addr()}
	for range 2 {
		addrs = append(addrs, dlocktest.RequireNew(t, dlocktest.Redis).Addr())
	}
	code, out, errOut := runCmd(t, "bench", "primitives", "-backends", "redlock",
		"-url", "redlock=redlock://"+strings.Join(addrs, ",")+"/0", "-q")
	if code != 0 {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var row []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "redlock" {
			row = f
			break
		}
	}
	if len(row) != 11 || strings.Join(row[1:], " ") != "- - - - - - - - - -" {
		t.Errorf("redlock row %q, want '-' in every column, in:\n%s", row, out)
	}
	// AcquireAll needs nothing of the driver: a row per size, each with a
	// ratio to the single acquisitions.
	at := strings.Index(out, "AcquireAll of k names")
	if at < 0 {
		t.Fatalf("no AcquireAll table in:\n%s", out)
	}
	var sizes []string
	for line := range strings.Lines(out[at:]) {
		if f := strings.Fields(line); len(f) == 7 && f[0] == "redlock" && strings.HasSuffix(f[6], "×") {
			sizes = append(sizes, f[1])
		}
	}
	if strings.Join(sizes, ",") != "2,5,20" {
		t.Errorf("AcquireAll rows for sizes %q, want 2,5,20, in:\n%s", sizes, out)
	}
	for _, want := range []string{"redlock: no semaphore", "redlock: no rwlock", "redlock: no election"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
