package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// DLOCK_TEST_CLOCK_OFFSET shifts the clock that names -once-per's slot, in
// the dlock run that a test starts: a host whose clock is off.
func init() {
	if d, err := time.ParseDuration(os.Getenv("DLOCK_TEST_CLOCK_OFFSET")); err == nil {
		runClock = func() time.Time { return time.Now().Add(d) }
	}
}

func TestRunOnceUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"negative period", []string{"-once-per", "-1s"}, "negative"},
		{"negative retention", []string{"-once-per", "1m", "-once-retention", "-1s"}, "negative"},
		{"negative attempts", []string{"-once-per", "1m", "-once-attempts", "-1"}, "negative"},
		{"retention alone", []string{"-once-retention", "1h"}, "go with -once-per"},
		{"attempts alone", []string{"-once-attempts", "2"}, "go with -once-per"},
		{"offset alone", []string{"-once-offset", "1m"}, "go with -once-per"},
		{"offset past the period", []string{"-once-per", "1h", "-once-offset", "1h"}, "less than"},
		{"negative offset", []string{"-once-per", "1h", "-once-offset", "-1m"}, "negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"run", "-url", "mem://"}, tt.args...), "job", "--", "true")
			code, _, errOut := runCmd(t, args...)
			if code != exitUsage || !strings.Contains(errOut, tt.want) {
				t.Errorf("status %d, stderr %q; want %d and %q", code, errOut, exitUsage, tt.want)
			}
		})
	}
}

// The statuses of -once-per on mem:// (one process, one store): the first
// run of a slot runs the command (with DLOCK_SLOT); a later one exits with
// 79 without running it; a failed run leaves the slot open; -once-attempts
// gives it up with 80.
func TestRunOnceStatuses(t *testing.T) {
	u := "mem://run-once-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	before := dlock.Slot(time.Now(), time.Hour)
	code, out, errOut := runCmd(t, "run", "-url", u, "-once-per", "1h", "report", "--", "sh", "-c", `echo "ran $DLOCK_SLOT $DLOCK_NAME"`)
	after := dlock.Slot(time.Now(), time.Hour)
	slot := strings.Fields(out + " x x x")[1]
	if code != 0 || (slot != before && slot != after) || !strings.Contains(out, "once/report/"+slot) {
		t.Fatalf("first run: status %d, output %q; want 0 and slot %s; stderr:\n%s", code, out, before, errOut)
	}
	code, out, errOut = runCmd(t, "run", "-url", u, "-once-per", "1h", "report", "--", "sh", "-c", "echo ran")
	if code != exitSlotDone || out != "" || !strings.Contains(errOut, "done already") {
		t.Errorf("second run: status %d, output %q, stderr %q; want %d, none, \"done already\"", code, out, errOut, exitSlotDone)
	}

	// A daily job at 12:00 UTC names its day by that time.
	code, out, errOut = runCmd(t, "run", "-url", u, "-once-per", "24h", "-once-offset", "12h", "noon", "--", "sh", "-c", `echo "$DLOCK_SLOT"`)
	if code != 0 || !strings.HasSuffix(out, "T12:00:00Z\n") {
		t.Errorf("-once-offset 12h: status %d, slot %q; want 0 and a slot at 12:00 UTC; stderr:\n%s", code, out, errOut)
	}

	if code, _, errOut := runCmd(t, "run", "-url", u, "-once-per", "1h", "flaky", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("failing run: status %d; want the command's 3; stderr:\n%s", code, errOut)
	}
	if code, out, errOut := runCmd(t, "run", "-url", u, "-once-per", "1h", "flaky", "--", "sh", "-c", "echo again"); code != 0 || out != "again\n" {
		t.Fatalf("run after a failure: status %d, output %q; want 0, \"again\"; stderr:\n%s", code, out, errOut)
	}
	if code, _, _ := runCmd(t, "run", "-url", u, "-once-per", "1h", "flaky", "--", "true"); code != exitSlotDone {
		t.Errorf("run after the success: status %d; want %d", code, exitSlotDone)
	}

	for i := range 2 {
		if code, _, errOut := runCmd(t, "run", "-url", u, "-once-per", "1h", "-once-attempts", "2", "doomed", "--", "sh", "-c", "exit 3"); code != 3 {
			t.Fatalf("failing run %d: status %d; want 3; stderr:\n%s", i+1, code, errOut)
		}
	}
	code, out, errOut = runCmd(t, "run", "-url", u, "-once-per", "1h", "-once-attempts", "2", "doomed", "--", "sh", "-c", "echo ran")
	if code != exitSlotGivenUp || out != "" || !strings.Contains(errOut, "given up") {
		t.Errorf("run after 2 failures with -once-attempts 2: status %d, output %q, stderr %q; want %d, none, \"given up\"", code, out, errOut, exitSlotGivenUp)
	}
}

// Two hosts whose clocks are 30% of the period apart run a job from "cron"
// (a dlock run process started at every boundary of the host's own clock,
// not waiting for the last one) with -once-per over consecutive slots on
// Redis: every slot runs exactly once, the other host's try exiting with 79.
func TestRunOncePerSlotTwoHosts(t *testing.T) {
	u, _ := redisURL(t, false)
	const (
		slots  = 10
		period = 2 * time.Second // a dlock run under -race takes most of a second to start on a loaded machine
		skew   = period * 3 / 10
	)
	job := "run-slots-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ran := filepath.Join(t.TempDir(), "ran")
	first := time.Now().Truncate(period).Add(2 * period)
	type try struct {
		host     int
		intended string
		slot     string // the slot the process named (on stderr or in ran)
		code     int
		stderr   string
		err      error
	}
	var mu sync.Mutex
	var tries []try
	var wg sync.WaitGroup
	for h, offset := range []time.Duration{0, skew} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var procs sync.WaitGroup
			defer procs.Wait()
			for i := range slots {
				b := first.Add(time.Duration(i) * period)
				time.Sleep(time.Until(b.Add(-offset))) // the host's own boundary
				procs.Add(1)
				go func() {
					defer procs.Done()
					c := exec.Command(os.Args[0], "run", "-url", u, "-once-per", period.String(), job, "--",
						"sh", "-c", `echo "$DLOCK_SLOT" >> "$RAN"; echo "slot $DLOCK_SLOT" >&2; sleep 0.2`)
					c.Env = append(os.Environ(), "DLOCK_TEST_MAIN=1", "RAN="+ran, "DLOCK_TEST_CLOCK_OFFSET="+offset.String())
					var errOut strings.Builder
					c.Stderr = &errOut
					err := c.Run()
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						err = nil
					}
					code := -1
					if c.ProcessState != nil {
						code = c.ProcessState.ExitCode()
					}
					tr := try{host: h, intended: dlock.Slot(b, period), code: code, stderr: errOut.String(), err: err}
					for _, f := range strings.Fields(tr.stderr) {
						if _, perr := time.Parse(time.RFC3339Nano, f); perr == nil {
							tr.slot = f
						}
					}
					mu.Lock()
					tries = append(tries, tr)
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	data, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, s := range strings.Fields(string(data)) {
		runs[s]++
	}
	late := 0 // processes that named another slot than their boundary's (started over period/2 late)
	for _, tr := range tries {
		switch {
		case tr.err != nil:
			t.Errorf("host %d, slot %s: %v", tr.host, tr.intended, tr.err)
		case tr.code != 0 && tr.code != exitSlotDone:
			t.Errorf("host %d, slot %s: status %d; want 0 or %d; stderr:\n%s", tr.host, tr.intended, tr.code, exitSlotDone, tr.stderr)
		case tr.slot != tr.intended:
			late++
		}
	}
	total := 0
	for i := range slots {
		s := dlock.Slot(first.Add(time.Duration(i)*period), period)
		if runs[s] > 1 {
			t.Errorf("slot %s ran %d times", s, runs[s])
		} else if runs[s] == 0 && late == 0 {
			t.Errorf("slot %s never ran", s)
		}
		total += runs[s]
	}
	t.Logf("%d slots of %v on Redis, clocks %v apart: %d runs, %d tries (%d started too late for their slot)", slots, period, skew, total, len(tries), late)
}
