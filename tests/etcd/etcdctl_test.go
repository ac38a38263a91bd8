package etcd_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
)

// etcdctl returns the path of the etcdctl binary (Debian's etcd-client,
// which scripts/test.sh installs). Without one the tests fail when backends
// are required (DLOCK_REQUIRE_BACKENDS=1) and skip otherwise.
func etcdctl(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("etcdctl")
	if err != nil {
		if os.Getenv("DLOCK_REQUIRE_BACKENDS") == "1" {
			t.Fatal("no etcdctl on PATH (install etcd-client; scripts/test.sh does)")
		}
		t.Skip("no etcdctl on PATH")
	}
	return p
}

// `etcdctl lock <name> <command>` queued behind a dlock lease on the same
// name runs its command only once dlock has released.
func TestEtcdctlLockWaitsForDlock(t *testing.T) {
	bin := etcdctl(t)
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	const name = "etcdctl-job"
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--endpoints="+srv.Addr(), "lock", etcd.MutexName(prefix, name), "echo", "etcdctl-holds")
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waitQueue(t, ctx, raw, prefix, name, 2) // etcdctl's key is queued behind dlock's
	select {
	case err := <-exited:
		t.Fatalf("etcdctl lock ran while dlock held the lock: %v, output %q", err, out.String())
	default:
	}
	if ok, err := ls.Held(ctx); err != nil || !ok {
		t.Fatalf("Held with etcdctl queued behind: %v, %v", ok, err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil || !strings.Contains(out.String(), "etcdctl-holds") {
			t.Fatalf("etcdctl lock after dlock's release: %v, output %q", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("etcdctl lock not granted within 10s of dlock's release")
	}
	waitQueue(t, ctx, raw, prefix, name, 0)
}

// A lock held by `etcdctl lock <name>` excludes dlock: TryAcquire reports it
// busy, and Acquire is granted once etcdctl lets go.
func TestDlockWaitsForEtcdctlLock(t *testing.T) {
	bin := etcdctl(t)
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	const name = "etcdctl-held"

	cmd := exec.CommandContext(ctx, bin, "--endpoints="+srv.Addr(), "lock", etcd.MutexName(prefix, name))
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	// etcdctl prints the key it holds once it has the lock.
	lines := bufio.NewScanner(stdout)
	go func() {
		for lines.Scan() {
		}
		exited <- cmd.Wait()
	}()
	waitQueue(t, ctx, raw, prefix, name, 1) // etcdctl's key alone: it holds the lock

	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while etcdctl holds: got %v, want ErrNotAcquired", err)
	}
	got := make(chan error, 1)
	var ls *dlock.Lease
	go func() {
		var err error
		ls, err = l.Acquire(ctx, name, nil)
		got <- err
	}()
	waitQueue(t, ctx, raw, prefix, name, 2)
	select {
	case err := <-got:
		t.Fatalf("Acquire returned while etcdctl holds: %v", err)
	default:
	}
	// SIGINT: etcdctl unlocks and closes its session.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Acquire after etcdctl let go: %v (etcdctl: %q)", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("dlock not granted within 10s of etcdctl's interrupt (etcdctl: %q)", stderr.String())
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
