package redis_test

import (
	"bytes"
	"github.com/dlock/dlock/tests/internal/testutil"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
)

// On a real server: connection resets make the watchdog's refreshes fail,
// which the hook and the logger hear (Warn); a black-hole then loses the
// lease, which they hear too (Error), with the lock's name and without the
// token.
func TestObserverRefreshFailuresAndLoss(t *testing.T) {
	proxy := faultnet.ListenT(t, redisAddr(t))
	l := newLocker(t, newClient(t, proxy.Addr()), nil)
	var (
		mu    sync.Mutex
		kinds []dlock.EventKind
		buf   bytes.Buffer
	)
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	seen := func(k dlock.EventKind) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(kinds, k)
	}
	l.SetObserver(dlock.Observer{Logger: logger, Hook: func(ev dlock.Event) {
		mu.Lock()
		defer mu.Unlock()
		kinds = append(kinds, ev.Kind)
	}})
	name := "observe-" + testutil.RandomHex(4)
	// The TTL leaves a refresh, which the client retries on new
	// connections that the resets cut too, time to fail before ValidUntil
	// on a loaded machine (with 1s, its retries outlasted the lease, which
	// was then lost without a refresh failure to report).
	ls, err := l.Acquire(t.Context(), name, &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// With latency, a refresh is in flight long enough for a reset to cut it.
	proxy.SetLatency(30 * time.Millisecond)
	for end := time.Now().Add(20 * time.Second); !seen(dlock.EventRefreshFailed); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("no refresh failure within 20s of resets; events %v, lease: %v", kinds, ls.Err())
		}
		proxy.Reset()
	}
	proxy.SetLatency(0)
	proxy.Blackhole()
	select {
	case <-ls.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("lease not lost within 20s of the black-hole")
	}
	// The observer hands an event to the hook before the logger: wait for
	// both, or the log is read between the two.
	lost := "level=ERROR msg=\"dlock: lease lost\" lock=" + name
	logged := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), lost)
	}
	for end := time.Now().Add(10 * time.Second); !seen(dlock.EventLost) || !logged(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no EventLost (hook: %v) or no %q in the log (%v) within 10s of the loss", seen(dlock.EventLost), lost, logged())
		}
	}
	proxy.Heal()
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"level=WARN msg=\"dlock: refresh failed", lost} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, ls.Token()) {
		t.Error("the log shows the lease's token")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
