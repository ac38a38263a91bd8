package main

import (
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// `dlock bench queue -peers` on real servers runs dlock's queue and the
// backend's peer through every turn, briefly: each row has its
// throughputs, both latencies and the server's work per task, and the
// ratios' row follows.
func TestBenchQueuePeers(t *testing.T) {
	tests := []struct {
		backend, peer, unit string
		url                 func(t *testing.T) string
	}{
		{"redis", "asynq", "cmds", func(t *testing.T) string {
			return "redis://" + dlocktest.Require(t, dlocktest.Redis).Addr() + "/0"
		}},
		{"postgres", "river", "xacts", func(t *testing.T) string {
			return "postgres://" + dlocktest.PostgresUser + ":" + dlocktest.PostgresPassword + "@" +
				dlocktest.Require(t, dlocktest.Postgres).Addr() + "/" + dlocktest.PostgresDatabase + "?sslmode=disable"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, "bench", "queue", "-peers", "-backends", tt.backend, "-url", tt.backend+"="+tt.url(t),
				"-duration", "200ms", "-n", "5", "-delay", "20ms", "-q")
			if code != 0 {
				t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			rows := map[string][]string{}
			for line := range strings.Lines(stdout) {
				if f := strings.Fields(line); len(f) > 2 && f[0] == tt.backend {
					rows[f[1]] = f
				}
			}
			for _, c := range []string{"dlock", tt.peer} {
				r := rows[c]
				// backend queue enqueue/s process/s now-p50 p99 delayed-p50
				// p99 early, then per task (value unit) x3, cpu x2.
				if len(r) != 17 {
					t.Errorf("%s row %q in:\n%s", c, r, stdout)
					continue
				}
				for i, what := range map[int]string{2: "enqueue/s", 3: "process/s", 4: "now p50", 6: "delayed p50"} {
					if r[i] == "0" || r[i] == "-" {
						t.Errorf("%s: %s %q in:\n%s", c, what, r[i], stdout)
					}
				}
				for _, i := range []int{10, 12, 14} {
					if r[i] != tt.unit {
						t.Errorf("%s: per task unit %q, want %q (server counters not read) in:\n%s", c, r[i], tt.unit, stdout)
					}
				}
			}
			if rows["dlock÷"+tt.peer] == nil {
				t.Errorf("no dlock÷%s row in:\n%s", tt.peer, stdout)
			}
		})
	}
	if code, _, _ := runCmd(t, "bench", "queue", "-peers", "-backends", "memory"); code != 2 {
		t.Errorf("-peers -backends memory: status %d, want 2", code)
	}
}

// dlock bench queue takes mysql (the queue driver of the mysql module):
// its row has throughputs and a due-to-claimed latency, no floor; -peers
// refuses it, as it has none.
func TestBenchQueueMySQL(t *testing.T) {
	u := "mysql://" + dlocktest.MariaDBUser + ":" + dlocktest.MariaDBPassword + "@" +
		dlocktest.Require(t, dlocktest.MariaDB).Addr() + "/" + dlocktest.MariaDBDatabase
	code, out, errOut := runCmd(t, "bench", "queue", "-backends", "mysql", "-url", "mysql="+u,
		"-duration", "100ms", "-n", "5", "-rounds", "1", "-q")
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	var row []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "mysql" {
			row = f
		}
	}
	if len(row) != 9 || row[1] == "0" || row[2] != "-" || row[3] == "0" || row[7] == "-" {
		t.Fatalf("mysql row %q in:\n%s", row, out)
	}
	if code, _, _ := runCmd(t, "bench", "queue", "-backends", "mysql", "-peers", "-url", "mysql="+u); code != 2 {
		t.Errorf("-peers on mysql: status %d, want 2", code)
	}
}
