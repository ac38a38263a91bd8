package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// TestMain runs the tests, or, re-executed by them, dlock itself
// (DLOCK_TEST_MAIN=1) or a command dlock run starts (DLOCK_TEST_CHILD, see
// lockrun_test.go).
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("DLOCK_TEST_CHILD") == "batch" && os.Getenv("DLOCK_NAME") != "":
		// The command dlock run started (it sets DLOCK_NAME; the command
		// inherits DLOCK_TEST_MAIN too).
		os.Exit(batchChild())
	case os.Getenv("DLOCK_TEST_MAIN") == "1":
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	dlocktest.Main(m)
}

// runCmd runs the command with args and returns its status and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelp(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"help"}, 0, "dlock bench [flags]"},
		{[]string{"-h"}, 0, "dlock bench [flags]"},
		{[]string{"help", "bench"}, 0, "-backends"},
		{[]string{"bench", "-h"}, 0, ""},
		{[]string{}, 2, ""},
		{[]string{"frobnicate"}, 2, ""},
		{[]string{"help", "frobnicate"}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := runCmd(t, tt.args...)
			if code != tt.code {
				t.Errorf("status %d, want %d; stderr:\n%s", code, tt.code, errOut)
			}
			if !strings.Contains(out, tt.contains) {
				t.Errorf("stdout lacks %q:\n%s", tt.contains, out)
			}
		})
	}
}

func TestBenchUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown backend", []string{"-backends", "memory,nosuch"}, `unknown backend "nosuch"`},
		{"twice", []string{"-backends", "memory,memory"}, "given twice"},
		{"none", []string{"-backends", ","}, "no backend selected"},
		{"url unknown backend", []string{"-url", "nosuch=x://"}, `unknown backend "nosuch"`},
		{"url not name=URL", []string{"-url", "redis"}, "want name=URL"},
		{"url not selected", []string{"-backends", "memory", "-url", "redis=redis://127.0.0.1:1"}, "not in -backends"},
		{"output format", []string{"-backends", "memory", "-o", "out.csv"}, "extension"},
		{"zero workers", []string{"-backends", "memory", "-workers", "0"}, "must be positive"},
		{"arguments", []string{"-backends", "memory", "extra"}, "unexpected arguments"},
		{"bad flag", []string{"-nosuchflag"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, append([]string{"bench"}, tt.args...)...)
			if code != 2 {
				t.Errorf("status %d, want 2", code)
			}
			if out != "" {
				t.Errorf("stdout not empty:\n%s", out)
			}
			if !strings.Contains(errOut, tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, errOut)
			}
		})
	}
}

// small keeps a real run short.
var small = []string{"-duration", "100ms", "-n", "50", "-handoff-n", "4", "-settle", "2ms", "-workers", "2", "-rounds", "2"}

func TestBenchMemory(t *testing.T) {
	dir := t.TempDir()
	for _, ext := range []string{"json", "md", "txt"} {
		t.Run(ext, func(t *testing.T) {
			out := filepath.Join(dir, "report."+ext)
			args := append([]string{"bench", "-backends", "memory", "-o", out}, small...)
			code, stdout, stderr := runCmd(t, args...)
			if code != 0 {
				t.Fatalf("status %d; stderr:\n%s", code, stderr)
			}
			for _, want := range []string{"memory  (fencing=yes", "\nmem://", "unc p50", "dlock × floor speed", "load average", "fencing=yes"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			if !strings.Contains(stderr, "memory   dlock contended") {
				t.Errorf("stderr lacks progress lines:\n%s", stderr)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			switch ext {
			case "json":
				var rep struct {
					Backends []struct {
						Backend string
						Dlock   struct{ Contended struct{ Ops int64 } }
					}
				}
				if err := json.Unmarshal(b, &rep); err != nil {
					t.Fatalf("report is not JSON: %v", err)
				}
				if len(rep.Backends) != 1 || rep.Backends[0].Backend != "memory" || rep.Backends[0].Dlock.Contended.Ops <= 0 {
					t.Errorf("JSON report = %+v, want one memory backend with contended ops", rep)
				}
			case "md":
				if !strings.Contains(string(b), "| memory | dlock | floor |") {
					t.Errorf("Markdown report lacks the memory row:\n%s", b)
				}
			case "txt":
				if string(b) != stdout {
					t.Errorf("text report differs from stdout:\n%s\nvs\n%s", b, stdout)
				}
			}
		})
	}
}

func TestBenchQuiet(t *testing.T) {
	code, stdout, stderr := runCmd(t, append([]string{"bench", "-backends", "memory", "-q"}, small...)...)
	if code != 0 || stderr != "" {
		t.Errorf("status %d, stderr %q; want 0 and nothing", code, stderr)
	}
	if !strings.Contains(stdout, "memory  (fencing=yes") {
		t.Errorf("stdout lacks the table:\n%s", stdout)
	}
}

// A URL's password never appears in the output, even when everything fails.
func TestBenchRedactsURL(t *testing.T) {
	const secret = "s3cr3t-pw"
	args := append([]string{"bench", "-backends", "redis", "-url", "redis=redis://user:" + secret + "@127.0.0.1:1/0?dial_timeout=50ms"}, small...)
	code, stdout, stderr := runCmd(t, args...)
	if code != 1 {
		t.Errorf("status %d, want 1 (nothing listens on port 1)", code)
	}
	if strings.Contains(stdout+stderr, secret) {
		t.Errorf("output contains the password:\n%s\n%s", stdout, stderr)
	}
	if !strings.Contains(stdout, "redis://user:xxxxx@127.0.0.1:1/0") {
		t.Errorf("stdout lacks the redacted URL:\n%s", stdout)
	}
	if !strings.Contains(stdout, "ERR") {
		t.Errorf("stdout does not show the failures:\n%s", stdout)
	}

	// An unescaped '/' in the password: net/url reads the rest as the port.
	_, stdout, stderr = runCmd(t, "bench", "-backends", "redis", "-url", "redis=redis://user:"+secret+"/x@127.0.0.1:1/0")
	if strings.Contains(stdout+stderr, secret) || !strings.Contains(stderr, "invalid port after host") {
		t.Errorf("a malformed URL: output shows the password or not the reason:\n%s\n%s", stdout, stderr)
	}
}

// On a terminal, progress is one line rewritten in place, with failures
// kept on lines of their own and a newline at the end; elsewhere lines pass
// through as written.
func TestProgressWriter(t *testing.T) {
	var buf bytes.Buffer
	p := &progressWriter{w: &buf, tty: true}
	for _, l := range []string{"[1/2] memory dlock uncontended ok\n", "[2/2] memory floor uncontended FAILED: x\n", "[2/2] memory dlock handoff ok\n"} {
		if _, err := p.Write([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	want := "\r\033[K[1/2] memory dlock uncontended ok\r\033[K[2/2] memory floor uncontended FAILED: x\n\r\033[K[2/2] memory dlock handoff ok\n"
	if buf.String() != want {
		t.Errorf("terminal output %q, want %q", buf.String(), want)
	}
	buf.Reset()
	p = &progressWriter{w: &buf}
	_, _ = p.Write([]byte("a\nb\n"))
	p.Close()
	if buf.String() != "a\nb\n" {
		t.Errorf("plain output %q", buf.String())
	}
}

// dlock bench queue on memory prints its row with throughputs and a
// due-to-claimed latency; a backend without a task queue is bad usage.
func TestBenchQueueMemory(t *testing.T) {
	code, out, errOut := runCmd(t, "bench", "queue", "-backends", "memory", "-duration", "100ms", "-n", "5", "-rounds", "1", "-q")
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	var row []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "memory" {
			row = f
		}
	}
	if len(row) != 9 || row[1] == "0" || row[4] == "0" || row[7] == "-" {
		t.Fatalf("memory row %q in:\n%s", row, out)
	}
	if code, _, _ := runCmd(t, "bench", "queue", "-backends", "etcd"); code != 2 {
		t.Errorf("-backends etcd: status %d, want 2", code)
	}
}

func TestBenchPrimitivesMemory(t *testing.T) {
	code, out, errOut := runCmd(t, "bench", "primitives", "-backends", "memory", "-n", "20", "-duration", "100ms",
		"-failovers", "2", "-ttl", "50ms", "-q")
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	var row []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "memory" {
			row = f
			break // the first table's; the AcquireAll table follows
		}
	}
	if len(row) != 11 || slices.Contains(row, "-") || row[3] == "0" || row[8] != "50ms" {
		t.Fatalf("memory row %q in:\n%s", row, out)
	}
	if code, _, _ := runCmd(t, "bench", "primitives", "-backends", "nosuch"); code != 2 {
		t.Errorf("-backends nosuch: status %d, want 2", code)
	}
}
