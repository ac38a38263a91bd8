package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// INFO commandstats's calls are summed over its lines, whatever else they
// carry.
func TestCommandCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_zadd:calls=7,usec=3,usec_per_call=0.43\r\ncmdstat_info:calls=2,usec=9\r\n\r\n"
	if got := commandCalls(info); got != 19 {
		t.Errorf("got %d, want 19", got)
	}
	if got := commandCalls(""); got != 0 {
		t.Errorf("empty: got %d, want 0", got)
	}
}

// The peers table has a row per contender and, after each peer's, dlock ÷
// that peer: throughputs above 1 when dlock is faster, latencies and work
// per task below 1 when it is quicker or does less.
func TestWriteQueuePeersText(t *testing.T) {
	lat := func(p50, p99 time.Duration) *Latency { return &Latency{P50: p50, P99: p99} }
	results := []QueuePeerResult{
		{Backend: "redis", Contender: "dlock", Unit: "cmds", EnqueueOps: 2000, ProcessOps: 3000,
			Now: lat(time.Millisecond, 2*time.Millisecond), Delayed: lat(time.Millisecond, 4*time.Millisecond),
			PerTask: [3]float64{7, 16, 24}, CPUPerTask: [2]time.Duration{10 * time.Microsecond, 20 * time.Microsecond}},
		{Backend: "redis", Contender: "asynq", Unit: "cmds", EnqueueOps: 1000, ProcessOps: 1000,
			Now: lat(4*time.Millisecond, 8*time.Millisecond), Delayed: lat(2*time.Millisecond, 8*time.Millisecond), Early: 3,
			PerTask: [3]float64{14, 8, 48}, CPUPerTask: [2]time.Duration{20 * time.Microsecond, 40 * time.Microsecond},
			Errors: []string{"due at once: boom"}},
	}
	var b bytes.Buffer
	if err := WriteQueuePeersText(&b, QueuePeersConfig{}, results); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	var ratios []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "dlock÷asynq" {
			ratios = f
		}
	}
	want := []string{"redis", "dlock÷asynq", "2.00x", "3.00x", "0.25x", "0.25x", "0.50x", "0.50x", "0.50x", "2.00x", "0.50x", "0.50x", "0.50x"}
	if strings.Join(ratios, " ") != strings.Join(want, " ") {
		t.Errorf("ratios row %q, want %q in:\n%s", ratios, want, out)
	}
	for _, s := range []string{"7.0 cmds", "48.0 cmds", "ERROR redis asynq due at once: boom", "config: redis asynq"} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in:\n%s", s, out)
		}
	}
}
