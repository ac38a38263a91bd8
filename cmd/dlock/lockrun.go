package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// The exit statuses of dlock run besides the command's own.
const (
	exitFailed      = 1  // dlock itself failed: the backend unreachable, the command not started…
	exitUsage       = 2  // bad usage
	exitNotAcquired = 75 // the lock was not acquired: --try found it held, or --wait ran out (EX_TEMPFAIL)
	exitLost        = 76 // the lock was lost while the command ran: the command was terminated
	exitSlotDone    = 79 // -once-per: a run of the slot completed already (on any host); the command did not run
	exitSlotGivenUp = 80 // -once-per: the slot's runs failed -once-attempts times; the command did not run
)

const runUsage = `Usage: dlock run [flags] NAME -- COMMAND [ARG...]

Runs COMMAND while holding the lock NAME, and releases the lock when COMMAND
exits. COMMAND runs in a process group of its own with, in its environment:

	DLOCK_NAME         the lock's name
	DLOCK_FENCE        the fencing token (empty when the backend has none):
	                   pass it to what the command writes to, so that writes
	                   of a run whose lock was lost can be refused
	DLOCK_TOKEN        the lease's token
	DLOCK_VALID_UNTIL  when the lease would end without refresh (RFC 3339);
	                   dlock run refreshes it while COMMAND runs
	DLOCK_HEARTBEAT_FD with -heartbeat only: 3, the file descriptor on which
	                   COMMAND heartbeats (see below)

SIGINT, SIGTERM and SIGHUP are forwarded to COMMAND's process group. When
the lock is lost (the backend unreachable past the lease's validity, the lock
taken away), COMMAND's process group gets SIGTERM, then SIGKILL after
-grace, and dlock run exits with status 76. When COMMAND exits, whatever is
left of its process group gets the same treatment before the lock is
released, so nothing runs unprotected.

A lease lives as long as the work, not as long as dlock run, with either
flag (both end it the same way: dlock run stops refreshing it, and at its
TTL the lock is lost as above, with status 76):

	-max-hold D   the lease is refreshed for D at most, and so ends within
	              D + TTL of its grant, however long COMMAND runs
	-heartbeat D  the lease is refreshed only while COMMAND heartbeats at
	              least every D, and so ends within D + TTL of its last
	              heartbeat: COMMAND heartbeats by writing anything (a
	              byte, a line) to file descriptor 3, which it inherits as
	              a pipe (its number is also in DLOCK_HEARTBEAT_FD):

	                  for f in /data/in/*; do echo >&3; process "$f"; done

	              Children inherit the descriptor and may heartbeat too; a
	              program that closes inherited descriptors (sudo, some
	              daemons) cannot, and its lease ends after D + TTL.

Once per schedule slot, for cron lines on several hosts (-once-per D): NAME
is the job, and its slot the boundary of D nearest the current time, in RFC
3339 UTC: the multiples of D from 00:00 UTC (see dlock.Slot), moved by
-once-offset. COMMAND runs under the lock once/NAME/SLOT only if no host has
completed the slot: its success (exit status 0) is recorded on the backend
(kept for -once-retention), and a later try of the slot, on any host, exits
with 79 without running COMMAND (so does one that waited for the lock while
the slot ran). A COMMAND that fails, or whose lock is lost, leaves the slot
to the next try (after -once-attempts failures, tries exit with 80). COMMAND
also gets DLOCK_SLOT. Hosts name the same slot when their clocks and cron
delays differ by less than D/2 from the boundary: schedule the job at the
boundaries (a daily job at 12:00 UTC, 07:00 in New York, takes -once-per 24h
-once-offset 12h; without it, hosts a little apart could name two days). The
backend must keep records (etcd, postgres, zookeeper, and redis or redlock in
their default layout). The same crontab line on every host:

	*/5 * * * * dlock run -url etcd://etcd:2379 -once-per 5m report -- /opt/report.sh

Exit status: COMMAND's own (128+N when a signal N ended it); 75 when the lock
was not acquired (-try found it held, or -wait ran out); 76 when the lock was
lost while COMMAND ran; 79 (-once-per) when the slot's run had completed
already; 80 (-once-per) when the slot's runs failed -once-attempts times; 2
for bad usage; 1 when dlock run itself failed (the backend unreachable,
COMMAND not found, or COMMAND's success not recorded).

Example (crontab on two servers; exactly one runs the batch each night, the
other exits with 75):

	0 2 * * * dlock run -url redis://locks:6379/0 -try nightly-batch -- /opt/batch/run.sh

Flags, before or after NAME (they end at "--", after which everything is
COMMAND's; before "--", a word starting with "-" is a flag, and an unknown
one is bad usage):
`

// runMain is `dlock run`.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlock run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	rawURL := fs.String("url", "", "the lock backend's URL, as dlock.Open takes it (default $DLOCK_URL)")
	ttl := fs.Duration("ttl", 0, "the lease's TTL (default: the URL's ttl parameter, else 15s)")
	wait := fs.Duration("wait", 0, "give up waiting for the lock after this long, with status 75 (default: wait until interrupted)")
	try := fs.Bool("try", false, "do not wait: exit with status 75 at once if the lock is held")
	grace := fs.Duration("grace", 10*time.Second, "how long COMMAND's process group has between SIGTERM and SIGKILL")
	maxHold := fs.Duration("max-hold", 0, "stop refreshing the lease after this long: it is lost at most a TTL later (default: no bound; at least the TTL)")
	heartbeat := fs.Duration("heartbeat", 0, "refresh the lease only while COMMAND writes to fd 3 at least this often (default: no heartbeat needed)")
	oncePer := fs.Duration("once-per", 0, "run COMMAND once per slot of this period, across hosts: NAME is the job (exit 79 when the slot is done already)")
	onceRetention := fs.Duration("once-retention", 0, "with -once-per: how long the backend remembers a completed slot (default: the larger of 24h and twice -once-per)")
	onceAttempts := fs.Int("once-attempts", 0, "with -once-per: give a slot up after this many failed runs (exit 80; default: no bound)")
	onceOffset := fs.Duration("once-offset", 0, "with -once-per: the slots' boundaries are this far past the multiples of -once-per from 00:00 UTC")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	rest := fs.Args()
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "dlock run: "+format+"\n", a...)
		fmt.Fprintln(stderr, "usage: dlock run [-url URL] [-ttl D] [-wait D | -try] [-grace D] [-max-hold D] [-heartbeat D] [-once-per D [-once-offset D] [-once-retention D] [-once-attempts N]] NAME -- COMMAND [ARG...]")
		return exitUsage
	}
	if len(rest) == 0 {
		return usageErr("no lock name")
	}
	// Flags may come after NAME too: they end at "--" (which Parse drops)
	// or at the first word that is not a flag, COMMAND's. A word starting
	// with "-" before "--" is a flag, never COMMAND.
	name := rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	rest = fs.Args()
	switch {
	case len(rest) == 0:
		return usageErr("no command to run")
	case *try && *wait != 0:
		return usageErr("-try and -wait exclude each other")
	case *wait < 0, *ttl < 0, *maxHold < 0, *heartbeat < 0, *oncePer < 0, *onceRetention < 0, *onceOffset < 0:
		return usageErr("durations must not be negative")
	case *onceAttempts < 0:
		return usageErr("-once-attempts must not be negative")
	case *oncePer == 0 && (*onceRetention != 0 || *onceAttempts != 0 || *onceOffset != 0):
		return usageErr("-once-retention, -once-attempts and -once-offset go with -once-per")
	case *oncePer > 0 && *onceOffset >= *oncePer:
		return usageErr("-once-offset must be less than -once-per")
	case *grace <= 0:
		return usageErr("-grace must be positive")
	}
	if err := dlock.ValidateName(name); err != nil {
		return usageErr("%v", err)
	}
	var slot string
	if *oncePer > 0 {
		// dlock.Slot, with the boundaries moved by the offset.
		at := runClock().Add(-*onceOffset).UTC().Round(*oncePer).Add(*onceOffset)
		slot = at.Format(time.RFC3339Nano)
		if err := dlock.ValidateName(dlock.OnceName(name, slot)); err != nil {
			return usageErr("%v", err)
		}
		if *onceRetention == 0 {
			*onceRetention = max(dlock.DefaultRetention, 2**oncePer)
		}
	}
	if *rawURL == "" {
		*rawURL = os.Getenv("DLOCK_URL")
	}
	if *rawURL == "" {
		return usageErr("no backend: give -url or set DLOCK_URL")
	}
	u, _ := url.Parse(*rawURL) // for redaction; Open reports a malformed URL
	path, err := exec.LookPath(rest[0])
	if err != nil {
		fmt.Fprintf(stderr, "dlock run: %v\n", err)
		return exitFailed
	}

	// Signals: while waiting they end the wait; once COMMAND runs they are
	// forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	l, closeLocker, code := openLocker(ctx, "dlock run", *rawURL, stderr)
	if l == nil {
		return code
	}
	defer closeLocker()

	opts := &dlock.Options{TTL: *ttl, MaxHold: *maxHold, HeartbeatTimeout: *heartbeat}
	if *oncePer > 0 {
		oo := &dlock.OnceOptions{Lock: opts, Retention: *onceRetention, MaxAttempts: *onceAttempts, NoWait: *try}
		run := func(ls *dlock.Lease) int {
			return runUnder(ctx, ls, path, rest, *grace, *heartbeat > 0, sigs, stdout, stderr, u, true, "DLOCK_SLOT="+slot)
		}
		return runOnce(ctx, l, name, slot, oo, *wait, sigs, stderr, u, run)
	}
	ls, code := acquireForRun(ctx, l, name, opts, *wait, *try, sigs, stderr, u)
	if ls == nil {
		return code
	}
	return runUnder(ctx, ls, path, rest, *grace, *heartbeat > 0, sigs, stdout, stderr, u, false)
}

// runClock is the clock that names the slot of -once-per (tests shift it).
var runClock = time.Now

// exitCode is a run's exit status, as an error that leaves the slot open.
type exitCode int

func (c exitCode) Error() string { return "exit status " + strconv.Itoa(int(c)) }

// runOnce is dlock run -once-per: dlock.Once with the command as its
// function. The wait for another host's run of the slot ends at a signal or
// when wait (if not zero) runs out, as acquireForRun's; neither bounds the
// command once it runs.
func runOnce(ctx context.Context, l *dlock.Locker, job, slot string, oo *dlock.OnceOptions, wait time.Duration, sigs <-chan os.Signal, stderr io.Writer, u *url.URL, run func(*dlock.Lease) int) int {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var timer *time.Timer
	if wait > 0 {
		timer = time.AfterFunc(wait, func() { cancel(errWaitRanOut) })
		defer timer.Stop()
	}
	started, watching := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-started:
		}
	}()
	var startOnce sync.Once
	start := func() {
		startOnce.Do(func() { close(started) })
		<-watching // from now on, runUnder forwards signals
	}
	defer start()
	name := dlock.OnceName(job, slot)
	err := l.Once(actx, job, slot, oo, func(_ context.Context, ls *dlock.Lease) error {
		start()
		if timer != nil && !timer.Stop() || actx.Err() != nil {
			return context.Cause(actx) // the wait ended as the lock came
		}
		if code := run(ls); code != 0 {
			return exitCode(code)
		}
		return nil
	})
	var code exitCode
	var sig signalError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, dlock.ErrAlreadyDone):
		fmt.Fprintf(stderr, "dlock run: %q: slot %s done already\n", job, slot)
		return exitSlotDone
	case errors.Is(err, dlock.ErrAttemptsExhausted):
		fmt.Fprintf(stderr, "dlock run: %q: slot %s given up: %v\n", job, slot, err)
		return exitSlotGivenUp
	case errors.As(context.Cause(actx), &sig):
		fmt.Fprintf(stderr, "dlock run: %v while waiting for %q\n", sig.s, name)
		return 128 + int(sig.s)
	case errors.Is(context.Cause(actx), errWaitRanOut):
		fmt.Fprintf(stderr, "dlock run: %q not acquired: still held after waiting %v\n", name, wait)
		return exitNotAcquired
	case oo.NoWait && errors.Is(err, dlock.ErrNotAcquired):
		fmt.Fprintf(stderr, "dlock run: %q not acquired: held by another\n", name)
		return exitNotAcquired
	case errors.Is(err, dlock.ErrInvalid), errors.Is(err, errors.ErrUnsupported):
		fmt.Fprintf(stderr, "dlock run: -once-per: %v\n", driver.RedactError(err, u))
		return exitUsage
	}
	fmt.Fprintf(stderr, "dlock run: %q: %v\n", name, driver.RedactError(err, u))
	return exitFailed
}

// acquireForRun takes the lock as the flags say; a signal ends the wait. It
// returns the lease, or nil and the exit status.
func acquireForRun(ctx context.Context, l *dlock.Locker, name string, opts *dlock.Options, wait time.Duration, try bool, sigs <-chan os.Signal, stderr io.Writer, u *url.URL) (*dlock.Lease, int) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if wait > 0 {
		var c context.CancelFunc
		actx, c = context.WithTimeoutCause(actx, wait, errWaitRanOut)
		defer c()
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-done:
		}
	}()
	var ls *dlock.Lease
	var err error
	if try {
		ls, err = l.TryAcquire(actx, name, opts)
	} else {
		ls, err = l.Acquire(actx, name, opts)
	}
	if err == nil {
		return ls, 0
	}
	var sig signalError
	switch {
	case errors.As(context.Cause(actx), &sig):
		fmt.Fprintf(stderr, "dlock run: %v while waiting for %q\n", sig.s, name)
		return nil, 128 + int(sig.s)
	case errors.Is(context.Cause(actx), errWaitRanOut):
		fmt.Fprintf(stderr, "dlock run: %q not acquired: still held after waiting %v\n", name, wait)
		return nil, exitNotAcquired
	case try && errors.Is(err, dlock.ErrNotAcquired):
		fmt.Fprintf(stderr, "dlock run: %q not acquired: held by another\n", name)
		return nil, exitNotAcquired
	case errors.Is(err, dlock.ErrInvalid):
		fmt.Fprintf(stderr, "dlock run: %v\n", driver.RedactError(err, u))
		return nil, exitUsage
	}
	fmt.Fprintf(stderr, "dlock run: acquiring %q: %v\n", name, driver.RedactError(err, u))
	return nil, exitFailed
}

var errWaitRanOut = errors.New("dlock run: -wait ran out")

type signalError struct{ s syscall.Signal }

func (e signalError) Error() string { return e.s.String() }

// runUnder runs the command under ls and returns dlock run's exit status.
// With heartbeat, the command gets the write end of a pipe as fd 3, and
// whatever it writes there is a heartbeat of ls. With keep, it leaves ls
// held (its caller releases it); env is added to the command's environment.
func runUnder(ctx context.Context, ls *dlock.Lease, path string, argv []string, grace time.Duration, heartbeat bool, sigs <-chan os.Signal, stdout, stderr io.Writer, u *url.URL, keep bool, env ...string) int {
	fence := ""
	if f, ok := ls.Fence(); ok {
		fence = strconv.FormatUint(f, 10)
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"DLOCK_NAME="+ls.Name(),
		"DLOCK_FENCE="+fence,
		"DLOCK_TOKEN="+ls.Token(),
		"DLOCK_VALID_UNTIL="+ls.ValidUntil().UTC().Format(time.RFC3339Nano),
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	release := func() {
		if keep {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := ls.Release(rctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
			fmt.Fprintf(stderr, "dlock run: releasing %q: %v\n", ls.Name(), driver.RedactError(err, u))
		}
	}
	var beats *os.File // the read end of the command's heartbeat pipe
	if heartbeat {
		r, w, err := os.Pipe()
		if err != nil {
			release()
			fmt.Fprintf(stderr, "dlock run: %v\n", err)
			return exitFailed
		}
		beats = r
		cmd.ExtraFiles = []*os.File{w} // fd 3
		cmd.Env = append(cmd.Env, "DLOCK_HEARTBEAT_FD=3")
	}
	err := cmd.Start()
	if beats != nil {
		_ = cmd.ExtraFiles[0].Close() // the command has its own copy
	}
	if err != nil {
		if beats != nil {
			_ = beats.Close()
		}
		release()
		fmt.Fprintf(stderr, "dlock run: %v\n", err)
		return exitFailed
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if beats != nil {
		read := make(chan struct{})
		go func() {
			defer close(read)
			readBeats(beats, ls)
		}()
		// Reading goes on until the command's group is gone (a write to a
		// pipe without a reader would kill the writer with SIGPIPE).
		defer func() { _ = beats.Close(); <-read }()
	}

	var waitErr error
	lost := false
	done := ls.Done()
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-done:
			if ls.Err() == nil {
				done = nil // released: not before the command exits
				continue
			}
			lost = true
			fmt.Fprintf(stderr, "dlock run: lost the lock %q: %v; terminating the command (SIGTERM, then SIGKILL after %v)\n",
				ls.Name(), driver.RedactError(ls.Err(), u), grace)
			waitErr = terminate(pgid, exited, grace)
			break loop
		}
	}
	// Nothing of the command may outlive the lock: stop what is left of its
	// process group (background children) before releasing.
	if !lost && groupAlive(pgid) {
		_ = terminate(pgid, nil, grace)
	}
	release()
	if lost {
		return exitLost
	}
	return exitStatus(waitErr)
}

// readBeats calls ls.Heartbeat for every read of r that returns data, until
// r ends or is closed.
func readBeats(r io.Reader, ls *dlock.Lease) {
	buf := make([]byte, 512)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			ls.Heartbeat()
		}
		if err != nil {
			return
		}
	}
}

// terminate sends SIGTERM to the process group, and SIGKILL to what is left
// of it once grace has passed; exited, when not nil, is the leader's Wait,
// whose result it returns. It returns once the group is gone (or, should
// members that are gone stay unreaped, a second after the SIGKILL).
func terminate(pgid int, exited <-chan error, grace time.Duration) error {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	kill := time.Now().Add(grace)
	var killed time.Time
	var err error
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for exited != nil || groupAlive(pgid) {
		select {
		case err = <-exited:
			exited = nil
			continue
		case <-tick.C:
		}
		switch now := time.Now(); {
		case killed.IsZero() && now.After(kill):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killed = now
		case !killed.IsZero() && exited == nil && now.Sub(killed) > time.Second:
			return err
		}
	}
	return err
}

// groupAlive reports whether a process of the group is left.
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// exitStatus is the shell's view of the command's end: its status, or
// 128+N for signal N.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitFailed
}

// openLocker opens the URL's Locker for a command named cmd; on failure it
// says why on stderr (without the password) and returns nil and the exit
// status: usage for a bad URL, failed otherwise.
func openLocker(ctx context.Context, cmd, rawURL string, stderr io.Writer) (*dlock.Locker, func(), int) {
	l, err := dlock.Open(ctx, rawURL)
	if err != nil {
		u, _ := url.Parse(rawURL)
		fmt.Fprintf(stderr, "%s: %v\n", cmd, driver.RedactError(err, u))
		if errors.Is(err, dlock.ErrInvalid) {
			return nil, nil, exitUsage
		}
		return nil, nil, exitFailed
	}
	return l, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = l.Close(cctx)
	}, 0
}
