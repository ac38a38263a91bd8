package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
)

// The tests of dlock run drive the real command: the test binary re-executed
// with DLOCK_TEST_MAIN=1 runs main (see TestMain), and the commands it runs
// are shell scripts or the test binary again with DLOCK_TEST_CHILD set (a
// batch job writing through a fenced store).

// dlockCmd returns the dlock command with args.
func dlockCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0], args...)
	c.Env = append(os.Environ(), "DLOCK_TEST_MAIN=1")
	return c
}

// runDlock runs dlock with args to its end and returns its status and output.
func runDlock(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	c := dlockCmd(t, args...)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	err := c.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return c.ProcessState.ExitCode(), out.String(), errOut.String()
}

func TestRunUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no name", []string{"run", "-url", "mem://"}, "no lock name"},
		{"no command", []string{"run", "-url", "mem://", "job", "--"}, "no command"},
		{"try and wait", []string{"run", "-url", "mem://", "-try", "-wait", "1s", "job", "--", "true"}, "exclude"},
		{"bad grace", []string{"run", "-url", "mem://", "-grace", "0s", "job", "--", "true"}, "grace"},
		{"invalid name", []string{"run", "-url", "mem://", "", "--", "true"}, "invalid"},
		{"no url", []string{"run", "job", "--", "true"}, "DLOCK_URL"},
		{"unknown scheme", []string{"run", "-url", "nosuch://h", "job", "--", "true"}, "forgotten import"},
		{"unknown flag", []string{"run", "-frobnicate", "job", "--", "true"}, "frobnicate"},
		{"unknown flag after the name", []string{"run", "-url", "mem://", "job", "-v", "--", "echo", "hi"}, "-v"},
		{"usage error after the name", []string{"run", "-url", "mem://", "job", "-try", "-wait", "1s", "--", "true"}, "exclude"},
		{"negative heartbeat", []string{"run", "-url", "mem://", "-heartbeat", "-1s", "job", "--", "true"}, "negative"},
		{"max-hold below the TTL", []string{"run", "-url", "mem://", "-ttl", "2s", "-max-hold", "1s", "job", "--", "true"}, "max hold 1s is below the TTL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("DLOCK_URL", "")
			code, _, errOut := runDlock(t, tt.args...)
			if code != exitUsage {
				t.Errorf("status %d, want %d; stderr:\n%s", code, exitUsage, errOut)
			}
			if !strings.Contains(errOut, tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, errOut)
			}
		})
	}
}

// The command sees the lock in its environment; its exit status (or 128+N
// for a signal N) is dlock run's.
func TestRunEnvAndStatus(t *testing.T) {
	code, out, errOut := runDlock(t, "run", "-url", "mem://", "-ttl", "5s", "nightly", "--",
		"sh", "-c", `echo "name=$DLOCK_NAME fence=$DLOCK_FENCE token=${#DLOCK_TOKEN} until=$DLOCK_VALID_UNTIL"; exit 3`)
	if code != 3 {
		t.Fatalf("status %d, want the command's 3; stderr:\n%s", code, errOut)
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(out) {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	if fields["name"] != "nightly" || fields["fence"] != "1" || fields["token"] != "32" {
		t.Errorf("command's environment: %q; want name=nightly fence=1 and a 32-digit token", out)
	}
	until, err := time.Parse(time.RFC3339Nano, fields["until"])
	if err != nil || time.Until(until) > 5*time.Second || time.Since(until) > time.Minute {
		t.Errorf("DLOCK_VALID_UNTIL %q: %v; want about 5s after the start", fields["until"], err)
	}
	if code, _, _ := runDlock(t, "run", "-url", "mem://", "job", "--", "sh", "-c", "kill -9 $$"); code != 128+9 {
		t.Errorf("command killed by SIGKILL: status %d, want %d", code, 128+9)
	}
	if code, _, errOut := runDlock(t, "run", "-url", "mem://", "job", "--", "/nonexistent/cmd"); code != exitFailed {
		t.Errorf("missing command: status %d, want %d; stderr:\n%s", code, exitFailed, errOut)
	}
}

// Flags after the lock name, before "--", are dlock run's own, as before
// it; what follows "--" (or the first word that is not a flag) is the
// command's.
func TestRunFlagsAfterName(t *testing.T) {
	t.Setenv("DLOCK_URL", "")
	code, out, errOut := runDlock(t, "run", "job", "-url", "mem://", "-ttl", "5s", "--", "sh", "-c", "echo $DLOCK_NAME -v; exit 3")
	if code != 3 || out != "job -v\n" {
		t.Errorf("status %d, stdout %q; want 3 and \"job -v\"; stderr:\n%s", code, out, errOut)
	}
	code, out, errOut = runDlock(t, "run", "-url", "mem://", "job", "echo", "-v")
	if code != 0 || out != "-v\n" {
		t.Errorf("without --: status %d, stdout %q; want 0 and \"-v\"; stderr:\n%s", code, out, errOut)
	}
}

// startDlock starts dlock with args and returns it with a reader of its
// stdout's lines.
func startDlock(t *testing.T, args ...string) (*exec.Cmd, <-chan string, *syncBuffer) {
	t.Helper()
	c := dlockCmd(t, args...)
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	c.Stderr = stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return c, lines, stderr
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// expectLine waits for a line with the prefix and returns it.
func expectLine(t *testing.T, lines <-chan string, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("output ended before a line %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line %q within 30s", prefix)
		}
	}
}

// waitExit waits for c and returns its exit status.
func waitExit(t *testing.T, c *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("dlock run did not exit within 60s")
	}
	return c.ProcessState.ExitCode()
}

// alive reports whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may contain spaces, the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// trapScript prints each signal it gets, starts a grandchild in the
// background and prints both pids, then waits; SIGTERM ends it with 143.
const trapScript = `trap 'echo got HUP' HUP; trap 'echo got INT' INT; trap 'echo got TERM; exit 143' TERM
sleep 120 & echo "pids $$ $!"
while :; do wait; done`

// SIGINT and SIGHUP reach the command; SIGTERM ends it, and dlock run exits
// with its status; nothing of its process group is left.
func TestRunForwardsSignals(t *testing.T) {
	c, lines, stderr := startDlock(t, "run", "-url", "mem://", "-grace", "2s", "job", "--", "sh", "-c", trapScript)
	pids := strings.Fields(expectLine(t, lines, "pids "))
	for _, s := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if err := c.Process.Signal(s); err != nil {
			t.Fatal(err)
		}
		expectLine(t, lines, "got "+strings.TrimPrefix(strings.ToUpper(unix(s)), "SIG"))
	}
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, "got TERM")
	if code := waitExit(t, c); code != 143 {
		t.Fatalf("status %d, want the command's 143; stderr:\n%s", code, stderr)
	}
	for _, p := range pids[1:] {
		pid, _ := strconv.Atoi(p)
		if alive(pid) {
			t.Errorf("process %d of the command's group outlived dlock run", pid)
		}
	}
}

func unix(s syscall.Signal) string {
	switch s {
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGINT:
		return "INT"
	}
	return s.String()
}

// redisURL returns a redis URL on the shared test server, through a fault
// proxy when proxied.
func redisURL(t *testing.T, proxied bool) (string, *faultnet.Proxy) {
	t.Helper()
	addr := dlocktest.Require(t, dlocktest.Redis).Addr()
	if !proxied {
		return "redis://" + addr + "/0", nil
	}
	p := faultnet.ListenT(t, addr)
	return "redis://" + p.Addr() + "/0", p
}

// Not acquired: -try finds the lock held, or -wait runs out: status 75, the
// command not run.
func TestRunNotAcquired(t *testing.T) {
	u, _ := redisURL(t, false)
	ctx := t.Context()
	l, err := dlock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	name := "run-held-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ls, err := l.Acquire(ctx, name, &dlock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(context.Background())
	for _, args := range [][]string{{"-try"}, {"-wait", "300ms"}} {
		full := append(append([]string{"run", "-url", u}, args...), name, "--", "sh", "-c", "echo ran")
		code, out, errOut := runDlock(t, full...)
		if code != exitNotAcquired || out != "" {
			t.Errorf("%v while held: status %d, output %q; want %d and no output; stderr:\n%s", args, code, out, exitNotAcquired, errOut)
		}
		if !strings.Contains(errOut, "not acquired") {
			t.Errorf("%v: stderr lacks \"not acquired\":\n%s", args, errOut)
		}
	}
}

// The lease lost (the backend cut off through the fault proxy past the
// lease's validity): the command's process group gets SIGTERM, dlock run
// says so on stderr and exits with 76, and nothing of the group is left.
func TestRunKillsOnLoss(t *testing.T) {
	u, proxy := redisURL(t, true)
	name := "run-loss-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c, lines, stderr := startDlock(t, "run", "-url", u, "-ttl", "1s", "-grace", "2s", name, "--", "sh", "-c", trapScript)
	pids := strings.Fields(expectLine(t, lines, "pids "))
	proxy.Blackhole()
	expectLine(t, lines, "got TERM")
	if code := waitExit(t, c); code != exitLost {
		t.Fatalf("status %d, want %d; stderr:\n%s", code, exitLost, stderr)
	}
	if !strings.Contains(stderr.String(), "lost the lock") || strings.Contains(stderr.String(), "panic") {
		t.Errorf("stderr does not say the lock was lost:\n%s", stderr)
	}
	for _, p := range pids[1:] {
		pid, _ := strconv.Atoi(p)
		if alive(pid) {
			t.Errorf("process %d of the command's group outlived the lost lock", pid)
		}
	}
	t.Logf("dlock run's stderr:\n%s", stderr)
}

// The seeds' batch service: two servers run the same nightly batch from cron
// under `dlock run -try`. Exactly one runs it; the other exits with 75. And a
// run whose lock is lost (cut off from Redis) is killed, while a second run,
// waiting on the lock, starts its writes only after the lock has passed to it:
// the store, which refuses writes with a fence below the highest it has seen,
// shows every write of the second run after every write of the first, and
// refused nothing or only the first run's late writes.
func TestRunNightlyBatch(t *testing.T) {
	direct, _ := redisURL(t, false)
	name := "run-batch-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	store := filepath.Join(t.TempDir(), "store")
	batch := func(url string, extra ...string) *exec.Cmd {
		args := append([]string{"run", "-url", url, "-ttl", "1s", "-grace", "2s"}, extra...)
		args = append(args, name, "--", os.Args[0], "-test.run=^$")
		c := dlockCmd(t, args...)
		c.Env = append(c.Env, "DLOCK_TEST_CHILD=batch", "DLOCK_TEST_STORE="+store)
		return c
	}

	// Two cron runs at once: one runs, the other is turned away.
	t.Setenv("DLOCK_TEST_WRITES", "20")
	night := []*exec.Cmd{batch(direct, "-try"), batch(direct, "-try")}
	var outs [2]bytes.Buffer
	for i, c := range night {
		c.Stderr = &outs[i]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	codes := map[int]int{}
	for _, c := range night {
		_ = c.Wait()
		codes[c.ProcessState.ExitCode()]++
	}
	if codes[0] != 1 || codes[exitNotAcquired] != 1 {
		t.Fatalf("two cron runs: statuses %v, want one 0 and one %d; stderr:\n%s\n%s", codes, exitNotAcquired, &outs[0], &outs[1])
	}
	if w := readStore(t, store); len(w.accepted) != 20 || len(w.refused) != 0 {
		t.Fatalf("store after one night: %d writes accepted, %d refused; want 20 and 0", len(w.accepted), len(w.refused))
	}

	// The next night the first run loses its lock half way.
	_ = os.Remove(store)
	t.Setenv("DLOCK_TEST_WRITES", "100000")
	proxied, proxy := redisURL(t, true)
	first := batch(proxied)
	firstErr := &syncBuffer{}
	first.Stderr = firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	waitFor(t, func() bool { return len(readStore(t, store).accepted) >= 5 })
	t.Setenv("DLOCK_TEST_WRITES", "20")
	second := batch(direct, "-wait", "30s")
	secondErr := &syncBuffer{}
	second.Stderr = secondErr
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
	proxy.Blackhole()
	if code := waitExit(t, first); code != exitLost {
		t.Fatalf("the cut-off run: status %d, want %d; stderr:\n%s", code, exitLost, firstErr)
	}
	if code := waitExit(t, second); code != 0 {
		t.Fatalf("the second run: status %d, want 0; stderr:\n%s", code, secondErr)
	}
	w := readStore(t, store)
	var firstFence, secondFence uint64
	lastFirst, firstSecond := -1, -1
	for i, a := range w.accepted {
		if firstFence == 0 {
			firstFence = a.fence
		}
		if a.fence == firstFence {
			lastFirst = i
		} else {
			secondFence = a.fence
			if firstSecond < 0 {
				firstSecond = i
			}
		}
	}
	switch {
	case secondFence <= firstFence:
		t.Fatalf("fences: first run %d, second %d; want the second higher", firstFence, secondFence)
	case firstSecond < 0 || lastFirst > firstSecond:
		t.Fatalf("a write of the first run (fence %d) was accepted after the second run's first write", firstFence)
	}
	for _, r := range w.refused {
		if r.fence != firstFence {
			t.Errorf("refused a write with fence %d: only the first run's (%d) may be refused", r.fence, firstFence)
		}
	}
	t.Logf("first run (fence %d): %d writes accepted, %d refused (late); second run (fence %d): %d; first run's stderr: %s",
		firstFence, lastFirst+1, len(w.refused), secondFence, len(w.accepted)-lastFirst-1, firstErr)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 30s")
		}
	}
}

type write struct{ fence uint64 }

type storeContents struct{ accepted, refused []write }

// readStore reads the fenced store's log: "ok <fence>" or "refused <fence>"
// lines.
func readStore(t *testing.T, path string) storeContents {
	t.Helper()
	var s storeContents
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s
	}
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		verdict, f, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue // a line being written
		}
		fence, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			continue
		}
		if verdict == "ok" {
			s.accepted = append(s.accepted, write{fence})
		} else {
			s.refused = append(s.refused, write{fence})
		}
	}
	return s
}

// batchChild is the batch job: DLOCK_TEST_WRITES writes, one every 2ms, each
// through the fenced store: under an exclusive flock of the store, a write
// whose fence is below the highest one accepted is refused.
func batchChild() int {
	fence, err := strconv.ParseUint(os.Getenv("DLOCK_FENCE"), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "batch: no fence:", err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv("DLOCK_TEST_WRITES"))
	f, err := os.OpenFile(os.Getenv("DLOCK_TEST_STORE"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "batch:", err)
		return 1
	}
	defer f.Close()
	for range n {
		if err := fencedWrite(f, fence); err != nil {
			fmt.Fprintln(os.Stderr, "batch:", err)
			return 1
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0
}

func fencedWrite(f *os.File, fence uint64) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	var highest uint64
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "ok "); ok {
			if x, err := strconv.ParseUint(v, 10, 64); err == nil && x > highest {
				highest = x
			}
		}
	}
	verdict := "ok"
	if fence < highest {
		verdict = "refused"
	}
	_, err = fmt.Fprintf(f, "%s %d\n", verdict, fence)
	return err
}

// With -heartbeat, the command heartbeats by writing to fd 3: while it does
// (for several TTLs) it runs; once it stops, the lease is lost within
// -heartbeat + TTL, the command is terminated and dlock run exits with 76,
// saying why.
func TestRunHeartbeat(t *testing.T) {
	const script = `trap 'echo got TERM; exit 143' TERM
echo "fd=$DLOCK_HEARTBEAT_FD"
i=0; while [ $i -lt 20 ]; do echo >&3; sleep 0.05; i=$((i+1)); done
echo stopped
while :; do sleep 1; done`
	c, lines, stderr := startDlock(t, "run", "-url", "mem://", "-ttl", "300ms", "-heartbeat", "200ms", "-grace", "2s", "job", "--", "sh", "-c", script)
	if l := expectLine(t, lines, "fd="); l != "fd=3" {
		t.Errorf("DLOCK_HEARTBEAT_FD: got %q, want fd=3", l)
	}
	// Heartbeating for 1s, over 3 TTLs, the command kept the lock.
	expectLine(t, lines, "stopped")
	stopped := time.Now()
	expectLine(t, lines, "got TERM")
	if d := time.Since(stopped); d > 200*time.Millisecond+300*time.Millisecond+2*time.Second {
		t.Errorf("terminated %v after the last heartbeat, want within -heartbeat + TTL (500ms) and some slack", d)
	}
	if code := waitExit(t, c); code != exitLost {
		t.Fatalf("status %d, want %d; stderr:\n%s", code, exitLost, stderr)
	}
	if !strings.Contains(stderr.String(), "lost the lock") || !strings.Contains(stderr.String(), "HeartbeatTimeout") {
		t.Errorf("stderr does not say the lock was lost for a missed heartbeat:\n%s", stderr)
	}
}

// With -max-hold, the lease is lost at most a TTL after it, however long
// the command runs; without -heartbeat the command has no fd 3.
func TestRunMaxHold(t *testing.T) {
	const script = `trap 'echo got TERM; exit 143' TERM
if { true >&3; } 2>/dev/null; then echo "fd 3 open"; else echo "no fd 3"; fi
echo "fd=$DLOCK_HEARTBEAT_FD"
while :; do sleep 1; done`
	start := time.Now()
	c, lines, stderr := startDlock(t, "run", "-url", "mem://", "-ttl", "300ms", "-max-hold", "600ms", "-grace", "2s", "job", "--", "sh", "-c", script)
	if l := expectLine(t, lines, "no fd 3"); l != "no fd 3" {
		t.Errorf("the command has a fd 3 without -heartbeat")
	}
	if l := expectLine(t, lines, "fd="); l != "fd=" {
		t.Errorf("DLOCK_HEARTBEAT_FD without -heartbeat: %q", l)
	}
	expectLine(t, lines, "got TERM")
	if d := time.Since(start); d < 600*time.Millisecond || d > 600*time.Millisecond+300*time.Millisecond+3*time.Second {
		t.Errorf("terminated %v after the start, want after -max-hold and within -max-hold + TTL (900ms) and some slack", d)
	}
	if code := waitExit(t, c); code != exitLost {
		t.Fatalf("status %d, want %d; stderr:\n%s", code, exitLost, stderr)
	}
	if !strings.Contains(stderr.String(), "lost the lock") || !strings.Contains(stderr.String(), "MaxHold") {
		t.Errorf("stderr does not say the lock was lost at its MaxHold:\n%s", stderr)
	}
}
